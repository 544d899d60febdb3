"""Who may send where. The answer is cached in Redis (read by the send script in the
same round trip as the seq allocation); this module fills that cache from PostgreSQL.
A lookup that fails lets the message through: a broken side path must not stop chat."""

from __future__ import annotations

import logging

from im_server import metrics
from im_server.context import Context
from im_server.ids import ConvRef
from im_server.storage import contacts, conversations

log = logging.getLogger("im_server.permissions")
PERM_TTL_SECONDS = 24 * 3600


async def send_statuses(ctx: Context, ref: ConvRef) -> dict[int, str]:
    async with ctx.db.connect() as conn:
        if ref.kind == "single":
            return await contacts.single_send_statuses(conn, ref.a, ref.b)
        return {uid: "ok" for uid in await conversations.active_member_ids(conn, ref.conv_id)}


async def load_send_permissions(ctx: Context, ref: ConvRef, epoch: str) -> bool:
    """Fill the cache; False when the lookup failed (the caller then fails open)."""
    try:
        statuses = await send_statuses(ctx, ref)
    except Exception as e:  # noqa: BLE001 - fail open on any store failure
        metrics.PERMISSION_LOOKUP_FAILURES.inc()
        log.warning("permission lookup for %s failed, letting the send through: %r", ref.conv_id, e)
        return False
    await ctx.redis.load_perm(ref.conv_id, epoch, statuses, PERM_TTL_SECONDS)
    return True


async def permissions_changed(ctx: Context, conv_ids: list[str]) -> None:
    """Call after a committed change of friendship, block, removal or membership."""
    try:
        await ctx.redis.invalidate_perm(conv_ids)
    except Exception as e:  # noqa: BLE001
        log.error("could not invalidate send permissions of %s: %r", conv_ids, e)
    for c in conv_ids:
        ctx.members_cache.drop(c)
        ctx.events.invalidate("members", c)


async def send_status(ctx: Context, ref: ConvRef, user_id: int) -> str:
    """'ok' or the refusal code for ``user_id`` sending in ``ref`` (the cache the send
    script reads, filled when cold); 'ok' when the lookup fails (fail open)."""
    try:
        st = await ctx.redis.perm_status(ref.conv_id, user_id)
        if st is None:
            await load_send_permissions(ctx, ref, await ctx.redis.perm_epoch(ref.conv_id))
            st = await ctx.redis.perm_status(ref.conv_id, user_id)
    except Exception:  # noqa: BLE001
        return "ok"
    return st or "ok"
