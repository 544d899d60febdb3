"""Groups: creation and membership. Each member has one visibility window in the
group's conversation; every membership change after creation is also a ``system``
message in the conversation's seq stream (creation itself posts none: the app's
webhooks hear of the first members from a ``member.added`` of its own)."""

from __future__ import annotations

import contextlib
from typing import Any

from im_server.context import Context
from im_server.errors import ImError, bad_request, not_found
from im_server.names import check_display_name
from im_server.protocol.ids import group_conv_id, parse_conv_id
from im_server.services import notify, outbox, permissions, seqs
from im_server.services.contacts import check_user_id
from im_server.storage import accounts, contacts, conversations, groups, memberships
from im_server.storage import webhooks as webhook_store
from im_server.storage.conversations import ROLE_ADMIN, ROLE_MEMBER, ROLE_NAMES, ROLE_OWNER
from im_server.storage.db import next_version_txn, now_ms

MAX_MEMBERS_PER_CALL = 5000


def check_user_ids(value: object) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_MEMBERS_PER_CALL:
        raise bad_request(f"user ids: a list of at most {MAX_MEMBERS_PER_CALL}")
    return sorted({check_user_id(v) for v in value})


BULK_ROWS = 100


def _bulk(ctx: Context, rows: int) -> contextlib.AbstractAsyncContextManager[object]:
    """The bulk-write gate for a call naming ``rows`` users (none for a small one): the
    whole call, its checks included, so a burst of them holds at most
    ``bulk_write_concurrency`` database connections."""
    return ctx.bulk_writes if rows > BULK_ROWS else contextlib.nullcontext()


async def do_create_group(
    ctx: Context, owner: int, name: object, member_ids: object
) -> dict[str, Any]:
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 64:
        raise bad_request("name: 1-64 characters")
    check_display_name(name, "name")
    ids = [u for u in check_user_ids(member_ids) if u != owner]
    await ctx.rate.members.hold(owner, "group changes")
    async with _bulk(ctx, len(ids)):
        return await _create_group(ctx, owner, name.strip(), ids)


async def _create_group(ctx: Context, owner: int, name: str, ids: list[int]) -> dict[str, Any]:
    if ids:
        async with ctx.db.connect() as conn:
            await _check_addable(conn, owner, ids)
    async with ctx.db.begin() as conn:
        # a new group's rows are invisible to everyone until the commit: written before
        # the sync-version lock, which then covers one statement (the conversation's
        # version, which is every member's state version)
        group_id = await groups.create_group(conn, name, owner)
        conv_id = group_conv_id(group_id)
        await conversations.ensure_conversation(conn, conv_id, conversations.GROUP, group_id)
        await memberships.upsert_members(conn, conv_id, [owner], ROLE_OWNER, 1, None, 0)
        if ids:
            await memberships.upsert_members(conn, conv_id, ids, ROLE_MEMBER, 1, None, 0)
        await webhook_store.group_created_event(conn, conv_id, owner, [owner, *ids], now_ms())
        await memberships.stamp(conn, conv_id, await next_version_txn(conn))
    await permissions.permissions_changed(ctx, [conv_id])
    await notify.changed(ctx, [owner, *ids])
    return {"group_id": group_id, "conv_id": conv_id}


async def list_members(ctx: Context, me: int, group_id: int) -> list[dict[str, Any]]:
    conv_id = group_conv_id(group_id)
    async with ctx.db.connect() as conn:
        mine = await memberships.member(conn, conv_id, me)
        if mine is None or not mine.active:
            if not await groups.group_exists(conn, group_id):
                raise not_found("no such group")
            raise ImError("not_member", "you are not a member of this group")
        rows = await memberships.members(conn, conv_id)
        names = await accounts.usernames(conn, [m.user_id for m in rows])
        mutes = dict(await memberships.active_member_mutes(conn, conv_id))
    now = now_ms()
    return [
        {
            "user_id": m.user_id,
            "role": ROLE_NAMES[m.role],
            "username": names.get(m.user_id),
            "muted_until": until if (until := mutes.get(m.user_id)) and until > now else None,
        }
        for m in rows
    ]


async def _require_admin(
    conn: Any, conv_id: str, actor: int, group_id: int
) -> conversations.MemberRow:
    me = await memberships.member(conn, conv_id, actor)
    if me is None or not me.active:
        if not await groups.group_exists(conn, group_id):
            raise not_found("no such group")
        raise ImError("not_member", "you are not a member of this group")
    if me.role < ROLE_ADMIN:
        raise ImError("forbidden", "only the owner and admins can do this")
    return me


async def _moderated(
    conn: Any, conv_id: str, actor: int, group_id: int, target: int, on_self: str, verb: str
) -> None:
    """``actor`` (owner or admin) may act on ``target``: another current member of a
    lower role."""
    me = await _require_admin(conn, conv_id, actor, group_id)
    if target == actor:
        raise bad_request(on_self)
    row = await memberships.member(conn, conv_id, target)
    if row is None or not row.active:
        raise not_found("that user is not a member")
    if row.role >= me.role:
        raise ImError("forbidden", f"you can only {verb} members of a lower role")


async def _check_addable(conn: Any, actor: int, user_ids: list[int]) -> None:
    """Every user exists and none of them blocked ``actor`` (a block reaches further
    than single-chat sends: whoever blocked me cannot be put in a group by me)."""
    known = await accounts.existing_user_ids(conn, user_ids)
    missing = sorted(set(user_ids) - known)
    if missing:
        raise not_found(f"no such users: {missing[:10]}")
    blockers = await contacts.blocked_by(conn, actor, user_ids)
    if blockers:
        raise ImError("blocked", f"these users do not accept being added by you: {blockers[:10]}")


async def do_add_members(
    ctx: Context, actor: int, group_id: int, user_ids: object, with_history: object = False
) -> dict[str, Any]:
    """Add (or re-add) members. New members see everything (with_history) or start after
    the current end, with no read cursor yet (the unread fallback applies); a re-join
    always starts after the current end, its read cursor at the end.

    The checks read outside any lock, members already in are skipped before anything
    is written (a repeated call writes nothing). The new members' rows are written before
    the sync-version lock, which every writer of the server waits for; under it come
    one check, the re-joins of former members (usually none), one row of the
    conversation and the notice: milliseconds, however many users the call names."""
    if not isinstance(with_history, bool):
        raise bad_request("with_history must be true or false")
    ids = check_user_ids(user_ids)
    if not ids:
        raise bad_request("user_ids must not be empty")
    await ctx.rate.members.hold(actor, "member changes")
    async with _bulk(ctx, len(ids)):
        return await _add_members(ctx, actor, group_id, ids, with_history)


async def _add_members(
    ctx: Context, actor: int, group_id: int, ids: list[int], with_history: bool
) -> dict[str, Any]:
    ref = parse_conv_id(group_conv_id(group_id))
    async with ctx.db.connect() as conn:
        await _require_admin(conn, ref.conv_id, actor, group_id)
        todo = await memberships.not_active_among(conn, ref.conv_id, ids)
        if todo:
            await _check_addable(conn, actor, todo)
    if not todo:
        return {"group_id": group_id, "added": []}
    end = await seqs.current_end(ctx, ref.conv_id)
    async with ctx.db.begin() as conn:
        # the bulk of the writes first, before the sync-version lock that every writer of
        # the server waits for: new rows are invisible until the commit, and their state
        # takes its version from the conversation's row, stamped under the lock
        added = await memberships.insert_new_members(
            conn, ref.conv_id, todo, 1 if with_history else end + 1
        )
        version = await next_version_txn(conn)
        # again under the lock: a demotion or kick of the actor may have committed since
        await _require_admin(conn, ref.conv_id, actor, group_id)
        new = set(added)
        former = [u for u in todo if u not in new]
        rejoined = (
            await memberships.rejoin_members(conn, ref.conv_id, former, end, version)
            if former
            else []
        )
        changed = sorted(added + rejoined)
        notice = None
        if changed:
            await memberships.stamp(conn, ref.conv_id, version)
            notice = await outbox.emit(
                conn,
                actor,
                ref.conv_id,
                "system",
                {
                    "event": "members_added",
                    "actor": actor,
                    "user_ids": changed,
                    "with_history": with_history,
                },
            )
    if notice is not None:
        await permissions.permissions_changed(ctx, [ref.conv_id])
        await notify.changed(ctx, changed)
        await outbox.deliver(ctx, [notice])
    return {"group_id": group_id, "added": changed}


async def _close(ctx: Context, actor: int, group_id: int, target: int, event: str) -> None:
    ref = parse_conv_id(group_conv_id(group_id))
    end = await seqs.current_end(ctx, ref.conv_id)
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        if event == "member_kicked":
            await _moderated(
                conn, ref.conv_id, actor, group_id, target, "use /leave to leave a group", "remove"
            )
        else:
            me_row = await memberships.member(conn, ref.conv_id, actor)
            if me_row is None or not me_row.active:
                if not await groups.group_exists(conn, group_id):
                    raise not_found("no such group")
                raise ImError("not_member", "you are not a member of this group")
            if me_row.role == ROLE_OWNER:
                await _hand_over(conn, ref.conv_id, actor, version)
        await memberships.close_window(conn, ref.conv_id, target, end, version)
        notice = await outbox.emit(
            conn,
            actor,
            ref.conv_id,
            "system",
            {"event": event, "actor": actor, "user_ids": [target]},
        )
    await permissions.permissions_changed(ctx, [ref.conv_id])
    await notify.changed(ctx, [target])
    await outbox.deliver(ctx, [notice])


async def _hand_over(conn: Any, conv_id: str, owner: int, version: int) -> None:
    """The owner leaves: the senior admin (else the senior member) becomes owner."""
    rest = [m for m in await memberships.members(conn, conv_id) if m.user_id != owner]
    if rest:
        heir = max(rest, key=lambda m: (m.role, -m.user_id))
        await memberships.set_role(conn, conv_id, heir.user_id, ROLE_OWNER, version)


async def do_kick(ctx: Context, actor: int, group_id: int, user_id: int) -> None:
    await _close(ctx, actor, group_id, user_id, "member_kicked")


async def do_leave(ctx: Context, user_id: int, group_id: int) -> None:
    await _close(ctx, user_id, group_id, user_id, "member_left")


async def do_mute(ctx: Context, actor: int, group_id: int, user_id: int, until: int) -> None:
    """Mute a member until ``until`` (ms); a time already past (0) lifts the mute. The
    owner mutes anyone, an admin only plain members; the change is a ``system`` notice
    (``member_muted`` with ``until``, or ``member_unmuted``) in the group's stream, and
    the send permissions are read again, so the member's next send is refused
    (``muted``) until then, on every process."""
    ref = parse_conv_id(group_conv_id(group_id))
    lifted = until <= now_ms()
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        await _moderated(
            conn, ref.conv_id, actor, group_id, user_id, "you cannot mute yourself", "mute"
        )
        await memberships.set_muted_until(
            conn, ref.conv_id, user_id, None if lifted else until, version
        )
        event: dict[str, Any] = {"actor": actor, "user_ids": [user_id]}
        if lifted:
            event = {"event": "member_unmuted", **event}
        else:
            event = {"event": "member_muted", **event, "until": until}
        notice = await outbox.emit(conn, actor, ref.conv_id, "system", event)
    await permissions.permissions_changed(ctx, [ref.conv_id])
    await outbox.deliver(ctx, [notice])


async def do_set_role(
    ctx: Context, actor: int, group_id: int, user_id: int, role: object
) -> dict[str, Any]:
    if role not in ("admin", "member"):
        raise bad_request("role must be 'admin' or 'member'")
    ref = parse_conv_id(group_conv_id(group_id))
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        me = await _require_admin(conn, ref.conv_id, actor, group_id)
        if me.role != ROLE_OWNER:
            raise ImError("forbidden", "only the owner can change roles")
        target = await memberships.member(conn, ref.conv_id, user_id)
        if target is None or not target.active or user_id == actor:
            raise not_found("that user is not a member")
        await memberships.set_role(
            conn, ref.conv_id, user_id, ROLE_ADMIN if role == "admin" else ROLE_MEMBER, version
        )
    return {"user_id": user_id, "role": role}
