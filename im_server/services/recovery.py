"""A Redis that lost its data (flushed, or a new server): the dedupe keys of recent sends
are gone, so for a while every send whose key is missing is checked against PostgreSQL
first. A Redis that merely restarted on its AOF keeps them; its seq counters are not
trusted either way (see extend_seq.lua), so no seq is reused."""

from __future__ import annotations

import logging

from im_server.context import Context
from im_server.storage import messages
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.recovery")


async def check_redis_epoch(ctx: Context) -> None:
    """Look at the boot markers (one per partition, each against the run id of the node
    serving the partition): one missing means that partition's data is gone (flush, new
    server, a replica promoted before it had the marker, or keys of an older layout), so
    open the dedupe recheck window if PostgreSQL already holds messages; then (re)write
    the markers with their nodes' run ids."""
    async with ctx.redis_recovery_lock:
        r = ctx.redis
        markers = await r.boot_markers()
        if all(marker == run_id for marker, run_id in markers):
            await r.refresh_cold_until()
            return
        lost = [p for p, (marker, _run_id) in enumerate(markers) if marker is None]
        had_data = False
        if lost:
            async with ctx.db.connect() as conn:
                had_data = await messages.any_messages(conn)
        if not lost:
            moved = sorted({(m, rid) for m, rid in markers if m != rid})
            log.info("redis restarted with its data (run ids %s)", moved)
        elif had_data:
            until = now_ms() + ctx.settings.dedupe_recheck_seconds * 1000
            await r.set_cold_until(until)
            log.warning(
                "redis lost the data of %d of %d partitions: checking dedupe in PostgreSQL "
                "for %d s",
                len(lost),
                len(markers),
                ctx.settings.dedupe_recheck_seconds,
            )
        await r.boot_markers(write=True)
        await r.refresh_cold_until()


async def watch_epoch(ctx: Context) -> None:
    """A periodic job: when the client connected to a Redis with a new run id, check its
    epoch (above); otherwise refresh the cold dedupe window, which another process may
    have opened."""
    r = ctx.redis
    if r.run_id_changed.is_set():
        r.run_id_changed.clear()
        try:
            await check_redis_epoch(ctx)
        except BaseException:
            r.run_id_changed.set()  # not checked yet: the next run tries again
            raise
    else:
        await r.refresh_cold_until()
