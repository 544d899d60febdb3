"""Group commit of read and delivered cursors. Reports are merged per (kind, conv, user)
(max wins) and written as one multi-row forward-only UPDATE: at once when idle, and
whatever arrives while a flush is in flight goes into the next one. A caller waits for at
most one flush, and learns the durable cursor value.

The merging (``PendingCursors``) and the hand-back of results (``settle``, ``fail``) are
pure; ``CursorBatcher`` adds the loop and the store step (``_write``, ``_changed``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, unavailable
from im_server.services import notify
from im_server.storage import cursors
from im_server.storage.cursors import CursorResult
from im_server.storage.db import next_version_txn, now_ms

log = logging.getLogger("im_server.cursors")
Key = tuple[str, str, int]  # kind, conv_id, user_id
OnMoved = Callable[[str, CursorResult, set[int]], None]


@dataclass(slots=True)
class _Pending:
    seq: int
    waiters: list[asyncio.Future[CursorResult]] = field(default_factory=list)
    origins: set[int] = field(default_factory=set)


Batch = dict[Key, _Pending]


class PendingCursors:
    """Reports not yet taken by a flush, one entry per (kind, conv, user): the highest
    seq wins, and every caller of that key waits for the flush that carries it."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: Batch = {}

    def __len__(self) -> int:
        return len(self._d)

    def add(
        self,
        kind: str,
        conv_id: str,
        user_id: int,
        seq: int,
        origin: int | None,
        waiter: asyncio.Future[CursorResult],
    ) -> None:
        key = (kind, conv_id, user_id)
        p = self._d.get(key)
        if p is None:
            p = self._d[key] = _Pending(seq)
        elif seq > p.seq:
            p.seq = seq
        p.waiters.append(waiter)
        if origin is not None:
            p.origins.add(origin)

    def take(self, max_rows: int) -> Batch:
        """The next batch: everything, or the ``max_rows`` oldest keys when there are more."""
        if len(self._d) > max_rows:
            keys = list(self._d)[:max_rows]
            return {k: self._d.pop(k) for k in keys}
        batch, self._d = self._d, {}
        return batch


def settle(batch: Batch, results: dict[Key, CursorResult], on_moved: OnMoved) -> set[int]:
    """Hand each waiter its durable cursor and report each moved cursor (with the
    connections it came from) to ``on_moved``; return the users whose sync state changed
    (the reader, and for a single chat both of its users)."""
    moved_users: set[int] = set()
    for key, p in batch.items():
        res = results[key]
        for w in p.waiters:
            if not w.done():
                w.set_result(res)
        if res.moved:
            moved_users.add(res.user_id)
            if res.conv_id.startswith("s:"):
                moved_users.update(int(x) for x in res.conv_id[2:].split(":"))
            try:
                on_moved(key[0], res, p.origins)
            except Exception:  # one failed push must not fail the batch
                log.exception("cursor push failed")
    return moved_users


def fail(batch: Batch, err: ImError) -> None:
    for p in batch.values():
        for w in p.waiters:
            if not w.done():
                w.set_exception(err)


class CursorBatcher:
    def __init__(self, ctx: Context, on_moved: OnMoved, max_rows: int = 5000) -> None:
        self.ctx = ctx
        self.on_moved = on_moved
        self.max_rows = max_rows
        self._pending = PendingCursors()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cursor-batcher")

    async def stop(self) -> None:
        """Flush what is pending, then stop."""
        if self._task is None:
            return
        deadline = asyncio.get_running_loop().time() + 5
        while (
            self._pending or not self._idle.is_set()
        ) and asyncio.get_running_loop().time() < deadline:
            self._wake.set()
            await asyncio.sleep(0.01)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def submit(
        self, kind: str, conv_id: str, user_id: int, seq: int, origin: int | None
    ) -> asyncio.Future[CursorResult]:
        fut: asyncio.Future[CursorResult] = asyncio.get_running_loop().create_future()
        self._pending.add(kind, conv_id, user_id, seq, origin, fut)
        self._wake.set()
        return fut

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                self._idle.clear()
                batch = self._pending.take(self.max_rows)
                try:
                    await self._flush(batch)
                except Exception as e:  # noqa: BLE001 - the callers hear of it
                    log.warning("cursor flush of %d rows failed: %r", len(batch), e)
                    fail(batch, unavailable("the database is unavailable, try again"))
                    await asyncio.sleep(0.2)
            self._idle.set()

    async def _flush(self, batch: Batch) -> None:
        results = await self._write(batch)
        metrics.READ_FLUSHES.inc()
        metrics.READ_FLUSH_ROWS.inc(len(batch))
        moved_users = settle(batch, results, self.on_moved)
        if moved_users:
            self._changed(moved_users)

    async def _write(self, batch: Batch) -> dict[Key, CursorResult]:
        """The store step: one transaction, one forward-only UPDATE per kind."""
        conv_ids = sorted({k[1] for k in batch})
        try:
            ends = await self.ctx.redis.current_seqs(conv_ids)
        except Exception:  # noqa: BLE001 - Redis down: clamp to the persisted end
            ends = {}
        by_kind: dict[str, list[tuple[str, int, int, int]]] = {}
        for (kind, conv_id, user_id), p in batch.items():
            by_kind.setdefault(kind, []).append((conv_id, user_id, p.seq, ends.get(conv_id, -1)))
        results: dict[Key, CursorResult] = {}
        async with self.ctx.db.begin() as conn:
            version = await next_version_txn(conn)
            s = self.ctx.settings
            due = now_ms() + int(s.push_badge_coalesce_seconds * 1000) if s.push_enabled else None
            for kind, rows in by_kind.items():
                for res in await cursors.advance(conn, kind, rows, version, badge_due=due):
                    results[(kind, res.conv_id, res.user_id)] = res
        return results  # badge rows are due later: the pusher's poll finds them

    def _changed(self, user_ids: set[int]) -> None:
        """Wake the long polls of users whose sync state moved."""
        self.ctx.spawn(notify.changed(self.ctx, user_ids))
