"""Who receives a conversation's events: both sides of a single chat, or a group's
active members (cached per process, dropped on every membership change)."""

from __future__ import annotations

from im_server.context import Context
from im_server.protocol.ids import ConvRef
from im_server.storage import memberships


def cached_recipients(ctx: Context, ref: ConvRef) -> list[int] | tuple[int, ...] | None:
    if ref.kind == "single":
        return (ref.a, ref.b)
    return ctx.members_cache.get(ref.conv_id)


async def recipients(ctx: Context, ref: ConvRef) -> list[int] | tuple[int, ...]:
    if ref.kind == "single":
        return (ref.a, ref.b)
    hit = ctx.members_cache.get(ref.conv_id)
    if hit is not None:
        return hit
    async with ctx.db.connect() as conn:
        ids = await memberships.active_member_ids(conn, ref.conv_id)
    ctx.members_cache.put(ref.conv_id, ids)
    return ids
