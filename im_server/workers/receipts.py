"""Batched ``receipt`` pushes: group conversations whose read cursors moved are marked
dirty; about once a second each dirty conversation's newest messages get their read
counts from one query over the cursors, and senders hear of the counts that changed.
Nothing here runs per read report, and groups above the receipts threshold get none."""

from __future__ import annotations

import asyncio
import logging

from im_server.context import Context
from im_server.protocol.server_frames import encode, receipt_push
from im_server.storage import cursors

log = logging.getLogger("im_server.receipts")
RECENT = 20


class ReceiptPusher:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._dirty: set[str] = set()
        self._last: dict[str, dict[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self.pushed = 0

    def touch(self, conv_id: str) -> None:
        self._dirty.add(conv_id)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="receipts")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        interval = self.ctx.settings.receipt_push_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if not self._dirty:
                continue
            dirty, self._dirty = self._dirty, set()
            for conv_id in dirty:
                try:
                    await self._push(conv_id)
                except Exception as e:  # noqa: BLE001 - the next read marks it again
                    log.warning("receipts for %s failed: %r", conv_id, e)

    async def _push(self, conv_id: str) -> None:
        async with self.ctx.db.connect() as conn:
            n = await cursors.active_member_count(conn, conv_id)
            if n > self.ctx.settings.receipts_count_max:
                return
            counts = await cursors.recent_read_counts(conn, conv_id, RECENT)
        last = self._last.setdefault(conv_id, {})
        keep: dict[int, int] = {}
        for seq, sender, count in counts:
            keep[seq] = count
            if count and last.get(seq) != count:
                frame = encode(receipt_push(conv_id, seq, count))
                self.ctx.events.push((sender,), frame)
                self.pushed += 1
        self._last[conv_id] = keep
        if len(self._last) > 10_000:
            self._last.clear()
