"""What the app's servers do for their users: send as one of them, make groups, add and
remove members, make two users friends at once. Each goes through the service a user's
own call uses (the send pipeline with its rules and dedupe, the group changes with their
notices in the group's seq stream), acting as the user the app names."""

from __future__ import annotations

from typing import Any

from im_server.context import Context
from im_server.errors import bad_request, not_found
from im_server.protocol.client_frames import SendFields
from im_server.protocol.ids import parse_conv_id
from im_server.protocol.server_frames import AckOk
from im_server.services import app_users, contacts, groups, send
from im_server.storage import groups as group_store
from im_server.storage import memberships
from im_server.storage.conversations import ROLE_OWNER

MEMBERS_MAX = 5000


async def send_as(ctx: Context, external_id: str, conv_id: str, fields: SendFields) -> AckOk:
    """The send of ``external_id``'s user: the same ack, refusals and dedupe."""
    ref = parse_conv_id(conv_id)
    (sender,) = await app_users.user_ids(ctx, [external_id], "from")
    return await send.accept(ctx, sender, ref, fields)


async def create_group(ctx: Context, name: str, owner: str, members: list[str]) -> dict[str, Any]:
    if len(members) > MEMBERS_MAX:
        raise bad_request(f"members: at most {MEMBERS_MAX}")
    (owner_id,) = await app_users.user_ids(ctx, [owner], "owner")
    member_ids = await app_users.user_ids(ctx, list(dict.fromkeys(members)), "members")
    return await groups.do_create_group(ctx, owner_id, name, member_ids)


async def _owner(ctx: Context, group_id: int) -> int:
    async with ctx.db.connect() as conn:
        rows = await memberships.members(conn, f"g:{group_id}")
        owner = next((m.user_id for m in rows if m.role == ROLE_OWNER), None)
        if owner is None and not await group_store.group_exists(conn, group_id):
            raise not_found("no such group")
    if owner is None:
        raise not_found("the group has no members")
    return owner


async def add_member(ctx: Context, group_id: int, external_id: str, with_history: bool) -> None:
    """Add the user as the group's owner would (a member already in: nothing changes)."""
    (user_id,) = await app_users.user_ids(ctx, [external_id], "external_id")
    owner = await _owner(ctx, group_id)
    await groups.do_add_members(ctx, owner, group_id, [user_id], with_history)


async def remove_member(ctx: Context, group_id: int, external_id: str) -> None:
    """Kick the user as the owner would; the owner itself leaves (ownership passes to
    the senior admin, else the senior member)."""
    (user_id,) = await app_users.user_ids(ctx, [external_id], "external_id")
    owner = await _owner(ctx, group_id)
    async with ctx.db.connect() as conn:
        row = await memberships.member(conn, f"g:{group_id}", user_id)
    if row is None or not row.active:
        return  # already out: a DELETE is idempotent
    if user_id == owner:
        await groups.do_leave(ctx, user_id, group_id)
    else:
        await groups.do_kick(ctx, owner, group_id, user_id)


async def befriend(ctx: Context, a: str, b: str) -> str:
    if a == b:
        raise bad_request("a and b must be two users")
    ua, ub = await app_users.user_ids(ctx, [a, b], "a/b")
    return await contacts.befriend_now(ctx, ua, ub)
