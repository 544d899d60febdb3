"""The cursor batcher without a database.

``PendingCursors``, ``settle`` and ``fail`` are pure. The group-commit loop is driven
through a subclass whose store step (``_write``) is a forward-only dict and whose wake-up
(``_changed``) records; the real store step is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from im_server.app import build_context
from im_server.config import load_settings
from im_server.context import Context
from im_server.errors import ImError, unavailable
from im_server.storage.cursors import CursorResult
from im_server.workers.cursors import (
    Batch,
    CursorBatcher,
    Key,
    PendingCursors,
    fail,
    settle,
)
from tests.support import eventually

Moved = tuple[str, CursorResult, set[int]]


def result(conv: str, user: int, value: int, moved: bool = True) -> CursorResult:
    return CursorResult(conv_id=conv, user_id=user, member=True, value=value, moved=moved)


# -- PendingCursors ------------------------------------------------------------------------


async def test_reports_merge_per_key_and_the_highest_seq_wins() -> None:
    loop = asyncio.get_running_loop()
    p = PendingCursors()
    w = [loop.create_future() for _ in range(4)]
    p.add("read", "g:1", 7, 5, 101, w[0])
    p.add("read", "g:1", 7, 9, 102, w[1])
    p.add("read", "g:1", 7, 3, None, w[2])  # lower: does not move the target back
    p.add("read", "g:1", 7, 9, 101, w[3])
    assert len(p) == 1
    batch = p.take(100)
    entry = batch[("read", "g:1", 7)]
    assert entry.seq == 9
    assert entry.waiters == w  # every caller waits for the flush that carries the key
    assert entry.origins == {101, 102}
    assert len(p) == 0


async def test_kind_conversation_and_user_are_separate_keys() -> None:
    loop = asyncio.get_running_loop()
    p = PendingCursors()
    reports = [
        ("read", "g:1", 7, 4),
        ("delivered", "g:1", 7, 6),
        ("read", "g:2", 7, 1),
        ("read", "g:1", 8, 2),
        ("read", "s:7:8", 7, 3),
    ]
    for kind, conv, user, seq in reports:
        p.add(kind, conv, user, seq, None, loop.create_future())
    batch = p.take(100)
    assert {k: v.seq for k, v in batch.items()} == {(k, c, u): s for k, c, u, s in reports}
    assert all(v.origins == set() for v in batch.values())


async def test_take_splits_oldest_keys_first() -> None:
    loop = asyncio.get_running_loop()
    p = PendingCursors()
    for user in range(1, 6):
        p.add("read", "g:1", user, user, None, loop.create_future())
    assert [k[2] for k in p.take(2)] == [1, 2]
    assert len(p) == 3
    assert [k[2] for k in p.take(2)] == [3, 4]
    assert [k[2] for k in p.take(2)] == [5]
    assert p.take(2) == {} and len(p) == 0


async def test_a_report_after_take_goes_to_the_next_batch() -> None:
    """The merge while a flush is in flight: a taken batch is never changed again."""
    loop = asyncio.get_running_loop()
    p = PendingCursors()
    first, second = loop.create_future(), loop.create_future()
    p.add("read", "g:1", 7, 5, None, first)
    in_flight = p.take(100)
    p.add("read", "g:1", 7, 9, 3, second)
    assert in_flight[("read", "g:1", 7)].seq == 5
    assert in_flight[("read", "g:1", 7)].waiters == [first]
    nxt = p.take(100)
    assert nxt[("read", "g:1", 7)].seq == 9 and nxt[("read", "g:1", 7)].waiters == [second]


# -- settle / fail -------------------------------------------------------------------------


async def pending(reports: list[tuple[str, str, int, int, int | None]]) -> Batch:
    loop = asyncio.get_running_loop()
    p = PendingCursors()
    for kind, conv, user, seq, origin in reports:
        p.add(kind, conv, user, seq, origin, loop.create_future())
    return p.take(1000)


async def test_settle_answers_every_waiter_and_reports_moved_cursors() -> None:
    batch = await pending(
        [
            ("read", "g:1", 7, 5, 11),
            ("read", "g:1", 7, 6, 12),
            ("read", "s:3:7", 7, 4, None),
            ("delivered", "s:3:9", 9, 2, 13),
            ("read", "g:2", 8, 1, 14),
        ]
    )
    results = {
        ("read", "g:1", 7): result("g:1", 7, 6),
        ("read", "s:3:7", 7): result("s:3:7", 7, 4),
        ("delivered", "s:3:9", 9): result("s:3:9", 9, 2),
        ("read", "g:2", 8): result("g:2", 8, 3, moved=False),  # already further
    }
    calls: list[Moved] = []
    users = settle(batch, results, lambda kind, res, origins: calls.append((kind, res, origins)))
    for key, p in batch.items():
        assert [w.result() for w in p.waiters] == [results[key]] * len(p.waiters)
    assert calls == [
        ("read", results[("read", "g:1", 7)], {11, 12}),
        ("read", results[("read", "s:3:7", 7)], set()),
        ("delivered", results[("delivered", "s:3:9", 9)], {13}),
    ]
    # the reader, and both users of a single chat; nobody for a cursor that did not move
    assert users == {7, 3, 9}


async def test_settle_survives_a_failing_callback(caplog: pytest.LogCaptureFixture) -> None:
    batch = await pending([("read", "g:1", 1, 5, None), ("read", "g:1", 2, 5, None)])
    results = {k: result(k[1], k[2], 5) for k in batch}
    seen: list[int] = []

    def on_moved(kind: str, res: CursorResult, origins: set[int]) -> None:
        seen.append(res.user_id)
        if res.user_id == 1:
            raise RuntimeError("push failed")

    with caplog.at_level(logging.ERROR, logger="im_server.cursors"):
        users = settle(batch, results, on_moved)
    assert seen == [1, 2]
    assert users == {1, 2}
    assert all(w.result().value == 5 for p in batch.values() for w in p.waiters)
    assert "cursor push failed" in caplog.text


async def test_settle_and_fail_skip_cancelled_waiters() -> None:
    batch = await pending([("read", "g:1", 1, 5, None), ("read", "g:1", 1, 6, None)])
    gone, waiting = batch[("read", "g:1", 1)].waiters
    gone.cancel()
    settle(batch, {("read", "g:1", 1): result("g:1", 1, 6)}, lambda *a: None)
    assert gone.cancelled() and waiting.result().value == 6

    batch = await pending([("read", "g:1", 1, 5, None), ("read", "g:2", 1, 5, None)])
    futs = [w for p in batch.values() for w in p.waiters]
    futs[0].cancel()
    err = unavailable("the database is unavailable, try again")
    fail(batch, err)
    assert futs[0].cancelled()
    assert futs[1].exception() is err


# -- the group-commit loop -----------------------------------------------------------------


class FakeStoreBatcher(CursorBatcher):
    """The real loop; the store step is a forward-only dict, and calls wait while
    ``gate`` is clear (a flush in flight)."""

    def __init__(self, ctx: Context, max_rows: int = 5000) -> None:
        self.moved: list[Moved] = []
        super().__init__(ctx, lambda k, r, o: self.moved.append((k, r, o)), max_rows)
        self.cursors: dict[Key, int] = {}
        self.flushes: list[dict[Key, int]] = []
        self.woken: list[set[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def _write(self, batch: Batch) -> dict[Key, CursorResult]:
        self.flushes.append({k: p.seq for k, p in batch.items()})
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("database down")
        out: dict[Key, CursorResult] = {}
        for key, p in batch.items():
            old = self.cursors.get(key, 0)
            moved = p.seq > old
            if moved:
                self.cursors[key] = p.seq
            out[key] = result(key[1], key[2], max(old, p.seq), moved)
        return out

    def _changed(self, user_ids: set[int]) -> None:
        self.woken.append(user_ids)


@pytest.fixture
async def ctx() -> AsyncIterator[Context]:
    """Built the way the app builds it; nothing here connects to a store."""
    c = build_context(
        load_settings(
            database_url="postgresql://im@127.0.0.1:9/im", redis_url="redis://127.0.0.1:9"
        )
    )
    yield c
    await c.redis.close()
    await c.db.dispose()


@pytest.fixture
async def batcher(ctx: Context) -> AsyncIterator[FakeStoreBatcher]:
    b = FakeStoreBatcher(ctx)
    b.start()
    yield b
    b.gate.set()
    await b.stop()


async def test_an_idle_batcher_flushes_at_once(batcher: FakeStoreBatcher) -> None:
    res = await asyncio.wait_for(batcher.submit("read", "g:1", 7, 5, 42), 2.0)
    assert res == result("g:1", 7, 5)
    assert batcher.flushes == [{("read", "g:1", 7): 5}]
    assert batcher.moved == [("read", res, {42})]
    assert batcher.woken == [{7}]


async def test_reports_during_a_flush_merge_into_the_next_one(batcher: FakeStoreBatcher) -> None:
    batcher.gate.clear()
    first = batcher.submit("read", "g:1", 7, 5, 1)
    await eventually(lambda: batcher.flushes, timeout=2.0, interval=0.001)
    later = [
        batcher.submit("read", "g:1", 7, 8, 2),
        batcher.submit("read", "g:1", 7, 6, 3),
        batcher.submit("read", "s:7:9", 7, 2, None),
        batcher.submit("delivered", "s:7:9", 9, 2, 4),
    ]
    assert len(batcher.flushes) == 1  # nothing more until the flush in flight is done
    batcher.gate.set()
    assert (await first).value == 5
    values = [r.value for r in await asyncio.gather(*later)]
    assert values == [8, 8, 2, 2]  # the merged report answers all its callers
    assert batcher.flushes == [
        {("read", "g:1", 7): 5},
        {("read", "g:1", 7): 8, ("read", "s:7:9", 7): 2, ("delivered", "s:7:9", 9): 2},
    ]
    assert [(k, r.conv_id, r.value, o) for k, r, o in batcher.moved] == [
        ("read", "g:1", 5, {1}),
        ("read", "g:1", 8, {2, 3}),
        ("read", "s:7:9", 2, set()),
        ("delivered", "s:7:9", 2, {4}),
    ]
    assert batcher.woken == [{7}, {7, 9}]


async def test_a_cursor_that_does_not_move_is_not_reported(batcher: FakeStoreBatcher) -> None:
    await batcher.submit("read", "g:1", 7, 5, None)
    res = await batcher.submit("read", "g:1", 7, 3, 9)
    assert res.value == 5 and res.moved is False
    assert len(batcher.moved) == 1 and batcher.woken == [{7}]


async def test_max_rows_splits_a_batch(ctx: Context) -> None:
    b = FakeStoreBatcher(ctx, max_rows=2)
    b.start()
    try:
        futs = [b.submit("read", "g:1", u, 1, None) for u in range(1, 6)]
        assert [r.user_id for r in await asyncio.gather(*futs)] == [1, 2, 3, 4, 5]
        assert [sorted(k[2] for k in f) for f in b.flushes] == [[1, 2], [3, 4], [5]]
    finally:
        await b.stop()


async def test_a_failed_flush_answers_unavailable_and_the_next_one_works(
    batcher: FakeStoreBatcher,
) -> None:
    batcher.fail_next = True
    with pytest.raises(ImError) as exc:
        await asyncio.wait_for(batcher.submit("read", "g:1", 7, 5, None), 2.0)
    assert exc.value.code == "unavailable"
    assert batcher.moved == [] and batcher.woken == []
    res = await asyncio.wait_for(batcher.submit("read", "g:1", 7, 5, None), 2.0)
    assert res.value == 5 and res.moved


async def test_stop_flushes_what_is_pending(ctx: Context) -> None:
    b = FakeStoreBatcher(ctx)
    b.start()
    b.gate.clear()
    first = b.submit("read", "g:1", 1, 1, None)
    await eventually(lambda: b.flushes, timeout=2.0, interval=0.001)
    second = b.submit("read", "g:1", 2, 1, None)
    b.gate.set()
    await b.stop()
    assert first.result().value == 1 and second.result().value == 1
    assert len(b.flushes) == 2
