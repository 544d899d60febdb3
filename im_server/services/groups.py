"""Groups: creation and membership. Each member has one visibility window in the
group's conversation; every membership change after creation is also a ``system``
message in the conversation's seq stream."""

from __future__ import annotations

from typing import Any

from im_server.context import Context
from im_server.errors import bad_request, not_found
from im_server.ids import group_conv_id
from im_server.services import permissions
from im_server.services.contacts import check_user_id
from im_server.storage import accounts, conversations, groups
from im_server.storage.conversations import ROLE_MEMBER, ROLE_NAMES, ROLE_OWNER
from im_server.storage.db import next_version_txn

MAX_MEMBERS_PER_CALL = 5000


def check_user_ids(value: object) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_MEMBERS_PER_CALL:
        raise bad_request(f"user ids: a list of at most {MAX_MEMBERS_PER_CALL}")
    return sorted({check_user_id(v) for v in value})


async def do_create_group(ctx: Context, owner: int, name: object, member_ids: object) -> dict[str, Any]:
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 64:
        raise bad_request("name: 1-64 characters")
    ids = [u for u in check_user_ids(member_ids) if u != owner]
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        known = await accounts.existing_user_ids(conn, ids) if ids else set()
        missing = sorted(set(ids) - known)
        if missing:
            raise not_found(f"no such users: {missing[:10]}")
        group_id = await groups.create_group(conn, name.strip(), owner)
        conv_id = group_conv_id(group_id)
        await conversations.ensure_conversation(conn, conv_id, conversations.GROUP, group_id)
        await conversations.upsert_members(conn, conv_id, [owner], ROLE_OWNER, 1, None, version)
        if ids:
            await conversations.upsert_members(conn, conv_id, ids, ROLE_MEMBER, 1, None, version)
    await permissions.permissions_changed(ctx, [conv_id])
    return {"group_id": group_id, "conv_id": conv_id}


async def list_members(ctx: Context, me: int, group_id: int) -> list[dict[str, Any]]:
    conv_id = group_conv_id(group_id)
    async with ctx.db.connect() as conn:
        mine = await conversations.member(conn, conv_id, me)
        if mine is None:
            if not await groups.group_exists(conn, group_id):
                raise not_found("no such group")
            from im_server.errors import ImError

            raise ImError("not_member", "you are not a member of this group")
        rows = await conversations.members(conn, conv_id)
    return [{"user_id": m.user_id, "role": ROLE_NAMES[m.role]} for m in rows]
