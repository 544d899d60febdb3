"""Friends and blocks. Friendship is one row per pair; what one side did (removed the
other, cleared, blocked) is that side's own state."""

from __future__ import annotations

from typing import Any

from im_server.context import Context
from im_server.errors import ImError, bad_request, check_text, not_found
from im_server.protocol import server_frames
from im_server.protocol.ids import MAX_ID, single_conv_id
from im_server.services import notify, permissions, quotas, seqs
from im_server.storage import accounts, contacts, conversations
from im_server.storage.db import next_version_txn


def check_user_id(value: object, field: str = "user_id") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ID:
        raise bad_request(f"{field} must be a positive 64-bit integer")
    return value


def contacts_changed(ctx: Context, user_ids: list[int]) -> None:
    """After the commit: the users' devices re-read their friends and requests."""
    ctx.events.push(sorted(set(user_ids)), server_frames.CONTACTS)


async def _accept_txn(conn: Any, req: contacts.FriendRequest) -> str:
    version = await next_version_txn(conn)
    reverse = await contacts.pending_request(conn, req.to_user_id, req.from_user_id)
    ids = [req.request_id] + ([reverse.request_id] if reverse else [])
    await contacts.mark_accepted(conn, ids)
    await contacts.make_friends(conn, req.from_user_id, req.to_user_id)
    conv_id = single_conv_id(req.from_user_id, req.to_user_id)
    a, b = sorted((req.from_user_id, req.to_user_id))
    await conversations.ensure_conversation(conn, conv_id, conversations.SINGLE)
    await conversations.ensure_single_members(conn, conv_id, a, b, version)
    return conv_id


async def do_request_friend(
    ctx: Context, me: int, to_user_id: object, note: object = None
) -> dict[str, Any]:
    to = check_user_id(to_user_id, "to_user_id")
    if to == me:
        raise bad_request("you cannot befriend yourself")
    if note is None:
        note = ""
    if not isinstance(note, str) or len(note) > 256:
        raise bad_request("note: at most 256 characters")
    check_text(note, "note")
    await quotas.friend_request(ctx, me)  # every well-formed request counts, found or not
    accepted: str | None = None
    async with ctx.db.begin() as conn:
        if not await accounts.existing_user_ids(conn, [to]):
            raise not_found("no such user")
        if await contacts.are_friends(conn, me, to):
            raise ImError("conflict", "you are already friends")
        if await contacts.blocked_by(conn, me, [to]):
            raise ImError("blocked", "this user does not accept friend requests from you")
        reverse = await contacts.pending_request(conn, to, me)
        if reverse is not None:
            accepted = await _accept_txn(conn, reverse)
            request_id = reverse.request_id
        else:
            request_id = await contacts.create_request(conn, me, to, note)
    contacts_changed(ctx, [me, to])
    if accepted:
        await permissions.permissions_changed(ctx, [accepted])
        await notify.changed(ctx, [me, to])
        return {"request_id": request_id, "conv_id": accepted, "accepted": True}
    return {"request_id": request_id}


async def do_accept(ctx: Context, me: int, request_id: int) -> dict[str, Any]:
    async with ctx.db.begin() as conn:
        req = await contacts.request_by_id(conn, request_id, for_update=True)
        if req is None or req.to_user_id != me:
            raise not_found("no such friend request")
        if req.status == 1:  # accepted already: the same answer again
            return {"conv_id": single_conv_id(req.from_user_id, req.to_user_id)}
        if req.status != 0:  # declined or cancelled
            raise not_found("no such friend request")
        if await contacts.blocked_by(conn, me, [req.from_user_id]):
            raise ImError("blocked", "this user has blocked you")
        conv_id = await _accept_txn(conn, req)
    await permissions.permissions_changed(ctx, [conv_id])
    await notify.changed(ctx, [req.from_user_id, req.to_user_id])
    contacts_changed(ctx, [req.from_user_id, req.to_user_id])
    return {"conv_id": conv_id}


async def _close(ctx: Context, me: int, request_id: int, status: int) -> None:
    """Take a pending request off both lists: declined by its addressee, or cancelled by
    its sender (``me`` must be that side, else ``not_found``). Again is a no-op; an
    accepted request is a ``conflict``."""
    async with ctx.db.begin() as conn:
        req = await contacts.request_by_id(conn, request_id, for_update=True)
        declining = status == contacts.DECLINED
        if req is None or me != (req.to_user_id if declining else req.from_user_id):
            raise not_found("no such friend request")
        if req.status == 1:
            raise ImError("conflict", "this request was accepted")
        await contacts.close_request(conn, request_id, status)
    contacts_changed(ctx, [req.from_user_id, req.to_user_id])


async def do_decline(ctx: Context, me: int, request_id: int) -> None:
    """Decline a request to me: its sender is not told, and may ask again (within the
    friend-request quota)."""
    await _close(ctx, me, request_id, contacts.DECLINED)


async def do_cancel(ctx: Context, me: int, request_id: int) -> None:
    """Cancel a request I sent (once accepted: remove the friend instead)."""
    await _close(ctx, me, request_id, contacts.CANCELLED)


async def requests(ctx: Context, me: int) -> dict[str, Any]:
    async with ctx.db.connect() as conn:
        incoming, outgoing = await contacts.pending_for(conn, me)
        names = await accounts.usernames(
            conn,
            sorted({r.from_user_id for r in incoming} | {r.to_user_id for r in outgoing} | {me}),
        )

    def shown(r: contacts.FriendRequest) -> dict[str, Any]:
        return {
            **r.public(),
            "from_username": names.get(r.from_user_id),
            "to_username": names.get(r.to_user_id),
        }

    return {"incoming": [shown(r) for r in incoming], "outgoing": [shown(r) for r in outgoing]}


async def friends(ctx: Context, me: int) -> list[dict[str, Any]]:
    async with ctx.db.connect() as conn:
        rows = await contacts.friends_of(conn, me)
    return [
        {"user_id": uid, "username": name, "conv_id": single_conv_id(me, uid)} for uid, name in rows
    ]


async def do_remove_friend(ctx: Context, me: int, peer: int) -> None:
    """One-sided: hides the friend from my list and clears the chat on my side only."""
    check_user_id(peer)
    conv_id = single_conv_id(me, peer)
    end = await seqs.current_end(ctx, conv_id)
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        if not await contacts.set_removed(conn, me, peer):
            raise not_found("not a friend")
        await conversations.raise_min_seq(conn, conv_id, me, end + 1, version)
        await conversations.hide(conn, conv_id, me, end, version)
    await permissions.permissions_changed(ctx, [conv_id])
    await notify.changed(ctx, [me])
    contacts_changed(ctx, [me])


async def do_block(ctx: Context, me: int, peer: int, blocked: bool) -> None:
    """One direction: if I block you, you cannot send to me; I still can send to you.
    Blocking also declines your pending friend request to me."""
    check_user_id(peer)
    if peer == me:
        raise bad_request("you cannot block yourself")
    async with ctx.db.begin() as conn:
        if blocked:
            if not await accounts.existing_user_ids(conn, [peer]):
                raise not_found("no such user")
            await contacts.add_block(conn, me, peer)
            await contacts.decline_from(conn, me, peer)  # their pending request to me goes
        else:
            await contacts.remove_block(conn, me, peer)
    await permissions.permissions_changed(ctx, [single_conv_id(me, peer)])
    contacts_changed(ctx, [me, peer] if blocked else [me])


async def blocks(ctx: Context, me: int) -> list[int]:
    async with ctx.db.connect() as conn:
        return await contacts.blocks_of(conn, me)


async def befriend_now(ctx: Context, u1: int, u2: int) -> str:
    """Make two users friends at once, with no request (the app's servers, a chat with a
    bot): a pending request between them is accepted, "removed" is cleared on both
    sides (each side's clear point stays). Blocks stay as they are."""
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        pending = [
            r
            for r in (
                await contacts.pending_request(conn, u1, u2),
                await contacts.pending_request(conn, u2, u1),
            )
            if r is not None
        ]
        if pending:
            await contacts.mark_accepted(conn, [r.request_id for r in pending])
        await contacts.make_friends(conn, u1, u2)
        conv_id = single_conv_id(u1, u2)
        a, b = sorted((u1, u2))
        await conversations.ensure_conversation(conn, conv_id, conversations.SINGLE)
        await conversations.ensure_single_members(conn, conv_id, a, b, version)
    await permissions.permissions_changed(ctx, [conv_id])
    await notify.changed(ctx, [u1, u2])
    contacts_changed(ctx, [u1, u2])
    return conv_id
