"""Group commit of store calls (``Coalescer``) driven by a fake batch function."""

from __future__ import annotations

import asyncio

import pytest

from im_server.context.batching import Coalescer, KeyedCoalescer
from tests.support import eventually


class Store:
    """A fake batch call: records each batch; while ``gate`` is clear a call waits (a
    round trip in flight). ``fail`` makes the next call raise."""

    def __init__(self, *, open_: bool = True) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        if open_:
            self.gate.set()
        self.fail: BaseException | None = None

    async def run(self, items: list[int]) -> list[int | Exception]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        return [x * 10 if x >= 0 else ValueError(f"negative {x}") for x in items]


async def test_concurrent_submissions_share_one_call() -> None:
    store = Store()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    futs = [co.submit(i) for i in range(5)]
    assert await asyncio.gather(*futs) == [0, 10, 20, 30, 40]
    assert store.batches == [[0, 1, 2, 3, 4]]


async def test_an_idle_coalescer_runs_the_first_request_alone() -> None:
    store = Store()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    assert await co.submit(7) == 70
    assert await co.submit(8) == 80
    assert store.batches == [[7], [8]]


async def test_requests_during_a_call_form_the_next_batch() -> None:
    store = Store(open_=False)
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    first = co.submit(1)
    await eventually(lambda: store.batches, timeout=2.0, interval=0.001)
    later = [co.submit(i) for i in (2, 3, 4)]
    assert store.batches == [[1]]  # still in flight: the others wait
    store.gate.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30, 40]
    assert store.batches == [[1], [2, 3, 4]]


async def test_max_batch_splits_in_order() -> None:
    store = Store()
    co: Coalescer[int, int | Exception] = Coalescer(store.run, max_batch=2)
    futs = [co.submit(i) for i in range(5)]
    assert await asyncio.gather(*futs) == [0, 10, 20, 30, 40]
    assert store.batches == [[0, 1], [2, 3], [4]]


async def test_an_exception_in_the_results_reaches_only_its_waiter() -> None:
    store = Store()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    futs = [co.submit(i) for i in (1, -2, 3)]
    res = await asyncio.gather(*futs, return_exceptions=True)
    assert res[0] == 10 and res[2] == 30
    assert isinstance(res[1], ValueError) and str(res[1]) == "negative -2"


async def test_a_failed_batch_fails_its_waiters_and_not_later_batches() -> None:
    store = Store()
    store.fail = ConnectionError("store down")
    co: Coalescer[int, int | Exception] = Coalescer(store.run, max_batch=2)
    futs = [co.submit(i) for i in range(5)]
    res = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(res[0], ConnectionError) and isinstance(res[1], ConnectionError)
    assert res[0] is res[1]  # the very exception of the call, to every waiter
    assert res[2:] == [20, 30, 40]
    assert store.batches == [[0, 1], [2, 3], [4]]


async def test_it_keeps_working_after_an_error() -> None:
    store = Store()
    store.fail = ConnectionError("store down")
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    with pytest.raises(ConnectionError):
        await co.submit(1)
    assert await co.submit(2) == 20
    assert await asyncio.gather(co.submit(3), co.submit(4)) == [30, 40]


async def test_a_base_exception_reaches_the_waiters_as_runtime_error() -> None:
    """A cancelled store call must not leave its waiters hanging."""
    store = Store()
    store.fail = asyncio.CancelledError()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    futs = [co.submit(1), co.submit(2)]
    res = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in res)
    assert await co.submit(3) == 30  # the next submission starts a new drain


async def test_a_cancelled_waiter_does_not_disturb_the_batch() -> None:
    store = Store(open_=False)
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    a, b, c = co.submit(1), co.submit(2), co.submit(3)
    await eventually(lambda: store.batches, timeout=2.0, interval=0.001)
    b.cancel()
    store.gate.set()
    assert await a == 10 and await c == 30
    assert b.cancelled()
    assert store.batches == [[1, 2, 3]]


async def test_a_waiter_cancelled_before_the_call_is_still_sent() -> None:
    """The item is already queued: the call happens, the answer is dropped."""
    store = Store()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    a, b = co.submit(1), co.submit(2)
    a.cancel()
    assert await b == 20
    assert a.cancelled()
    assert store.batches == [[1, 2]]


async def test_a_cancelled_waiter_in_a_failed_batch() -> None:
    store = Store(open_=False)
    store.fail = ConnectionError("store down")
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    a, b = co.submit(1), co.submit(2)
    await eventually(lambda: store.batches, timeout=2.0, interval=0.001)
    a.cancel()
    store.gate.set()
    with pytest.raises(ConnectionError):
        await b
    assert a.cancelled()
    assert await co.submit(5) == 50


async def test_a_wrong_number_of_results_fails_the_batch_instead_of_hanging() -> None:
    async def short(items: list[int]) -> list[int]:
        return [x * 10 for x in items][:-1]

    co: Coalescer[int, int] = Coalescer(short)
    res = await asyncio.wait_for(
        asyncio.gather(co.submit(1), co.submit(2), return_exceptions=True), 1.0
    )
    assert all(isinstance(r, RuntimeError) and "2 got 1" in str(r) for r in res)


async def test_an_interrupted_call_also_fails_what_was_queued_behind_it() -> None:
    """After a cancelled store call (a shutdown) no drain is left to run the queue:
    those waiters hear of it at once instead of waiting for a submit that never comes."""
    store = Store(open_=False)
    store.fail = asyncio.CancelledError()
    co: Coalescer[int, int | Exception] = Coalescer(store.run)
    first = co.submit(1)
    await eventually(lambda: store.batches == [[1]])
    queued = co.submit(2)  # waits behind the call in flight
    store.gate.set()
    res = await asyncio.wait_for(asyncio.gather(first, queued, return_exceptions=True), 1.0)
    assert all(isinstance(r, RuntimeError) for r in res)


async def test_a_stuck_key_holds_up_only_its_own_queue() -> None:
    """One queue per key (a send's partition): while a call of key 0 hangs (its shard's
    primary is down), calls of key 1 go through and are batched among themselves."""
    stuck, healthy = Store(open_=False), Store()

    async def run(items: list[int]) -> list[int | Exception]:
        return await (stuck if items[0] % 2 == 0 else healthy).run(items)

    co: KeyedCoalescer[int, int | Exception] = KeyedCoalescer(run, key=lambda x: x % 2)
    held = [co.submit(x) for x in (0, 2)]
    await eventually(lambda: stuck.batches == [[0, 2]])
    assert await asyncio.wait_for(asyncio.gather(co.submit(1), co.submit(3)), 1) == [10, 30]
    assert healthy.batches == [[1, 3]]
    assert not any(f.done() for f in held)
    stuck.gate.set()
    assert await asyncio.gather(*held) == [0, 20]
    assert stuck.batches == [[0, 2]]
