"""Seq blocks: PostgreSQL keeps the reserved high-water mark per conversation and hands
Redis blocks of seqs. A Redis that lost its data, or a new one, restarts above the mark,
so a seq is never handed out twice."""

from __future__ import annotations

import asyncio
import logging

from im_server.context import Context
from im_server.errors import is_store_error
from im_server.protocol.ids import ConvRef
from im_server.storage import conversations

log = logging.getLogger("im_server.seqs")


async def refill(ctx: Context, ref: ConvRef) -> None:
    """Reserve the next block in PostgreSQL and install it in Redis. Concurrent callers
    of this process share one refill; across processes a Redis lock lets one refill at a
    time per conversation, so two blocks never race into a gap."""
    inflight = ctx.seq_refills.inflight
    fut = inflight.get(ref.conv_id)
    if fut is not None:
        await asyncio.shield(fut)
        return
    fut = asyncio.get_running_loop().create_future()
    inflight[ref.conv_id] = fut
    try:
        await _refill(ctx, ref)
        fut.set_result(None)
    except BaseException as e:
        fut.set_exception(e)
        fut.exception()  # retrieved: waiters re-raise it, nobody else needs to
        raise
    finally:
        inflight.pop(ref.conv_id, None)


async def _refill(ctx: Context, ref: ConvRef) -> None:
    for _ in range(1000):
        if await ctx.redis.lock_seq(ref.conv_id, ctx.settings.node_name):
            break
        await asyncio.sleep(0.005)  # another process is refilling
    else:
        return
    try:
        conv_type = conversations.SINGLE if ref.kind == "single" else conversations.GROUP
        async with ctx.db.begin() as conn:
            old, new = await conversations.reserve_seq_block(
                conn, ref.conv_id, conv_type, ctx.settings.seq_block_size
            )
        await ctx.redis.extend_seq(ref.conv_id, old, new)
    finally:
        await ctx.redis.unlock_seq(ref.conv_id)


def refill_soon(ctx: Context, ref: ConvRef) -> None:
    """Top the block up in the background before it runs out, so sends keep their order
    instead of queueing behind a refill."""
    pending = ctx.seq_refills.topping_up
    if ref.conv_id in pending:
        return
    pending.add(ref.conv_id)

    async def _run() -> None:
        try:
            await refill(ctx, ref)
        except Exception as e:  # the next send that runs dry refills in line
            if is_store_error(e):
                log.debug("background seq refill of %s failed: %r", ref.conv_id, e)
            else:
                log.exception("background seq refill of %s failed", ref.conv_id)
        finally:
            pending.discard(ref.conv_id)

    ctx.spawn(_run())


async def current_end(ctx: Context, conv_id: str) -> int:
    """The highest seq handed out in the conversation, persisted or not."""
    try:
        cur = await ctx.redis.current_seq(conv_id)
    except Exception:  # noqa: BLE001 - Redis down: the persisted end is the best we know
        cur = None
    async with ctx.db.connect() as conn:
        persisted = await conversations.allocated_end(conn, conv_id)
    return max(cur or 0, persisted)
