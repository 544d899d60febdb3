"""Who may send where. The answer is cached in Redis (read by the send script in the
same round trip as the seq allocation); this module fills that cache from PostgreSQL.

A lookup that fails or times out lets a single-chat message through (friendship and
blocks are a side path that must not stop chat: the seed's rule), but refuses a group
message with ``unavailable``: letting it through would let a kicked member post."""

from __future__ import annotations

import asyncio
import logging

from im_server import metrics
from im_server.context import Context
from im_server.errors import unavailable
from im_server.ids import ConvRef
from im_server.storage import contacts, conversations
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.permissions")
PERM_TTL_SECONDS = 24 * 3600


async def send_statuses(ctx: Context, ref: ConvRef) -> dict[int, str]:
    async with ctx.db.connect() as conn:
        if ref.kind == "single":
            return await contacts.single_send_statuses(conn, ref.a, ref.b)
        now = now_ms()
        return {
            uid: "ok" if until is None or until <= now else f"muted:{until}"
            for uid, until in await conversations.active_member_mutes(conn, ref.conv_id)
        }


async def load_send_permissions(ctx: Context, ref: ConvRef, epoch: str) -> bool:
    """Fill the cache. When the lookup fails or takes longer than the store timeout:
    False for a single chat (the caller lets the send through), ``unavailable`` for a
    group."""
    try:
        statuses = await asyncio.wait_for(
            send_statuses(ctx, ref), ctx.settings.store_timeout_seconds
        )
    except Exception as e:  # any store failure, a timeout included
        metrics.PERMISSION_LOOKUP_FAILURES.inc()
        if ref.kind == "group":
            log.warning("membership lookup for %s failed, refusing the send: %r", ref.conv_id, e)
            raise unavailable("group membership cannot be checked now, try again") from e
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


async def single_send_status(ctx: Context, ref: ConvRef, user_id: int) -> str:
    """'ok' or the refusal code for ``user_id`` writing in the single chat ``ref`` (the
    cache the send script reads, filled when cold); 'ok' when the lookup fails (a single
    chat fails open)."""
    assert ref.kind == "single"
    try:
        st = await ctx.redis.perm_status(ref.conv_id, user_id)
        if st is None:
            await load_send_permissions(ctx, ref, await ctx.redis.perm_epoch(ref.conv_id))
            st = await ctx.redis.perm_status(ref.conv_id, user_id)
    except Exception:  # noqa: BLE001 - fail open, as the send does
        return "ok"
    return st or "ok"
