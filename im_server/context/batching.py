"""Group commit for store calls: requests that arrive while a batch is in flight are
merged into the next batch, so N concurrent sends cost one round trip, not N, and an
idle server still answers the first request at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]], max_batch: int = 256) -> None:
        self._run = run
        self._max = max_batch
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._draining = False

    def submit(self, item: T) -> asyncio.Future[R]:
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                try:
                    results = await self._run([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"a batch of {len(batch)} got {len(results)} results")
                except BaseException as e:  # every waiter must hear of it
                    if isinstance(e, Exception):
                        _fail(batch, e)
                        continue
                    # cancelled (shutdown): nobody will drain what is queued either
                    _fail(batch + self._queue, RuntimeError(f"store call interrupted: {e!r}"))
                    self._queue = []
                    raise
                for (_, fut), res in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if isinstance(res, Exception):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
        finally:
            self._draining = False


class KeyedCoalescer(Generic[T, R]):
    """One :class:`Coalescer` per key (a send's stream partition): a batch waits only on
    the calls of its own key. Why: with one queue for all, a batch that touches a shard
    in trouble (a primary killed, failing over) holds up every batch behind it, and the
    healthy shards' sends wait as long as the sick one's; with a queue per partition,
    one shard's trouble stays on that shard."""

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[list[R]]],
        key: Callable[[T], Hashable],
        max_batch: int = 256,
    ) -> None:
        self._run, self._key, self._max = run, key, max_batch
        self._queues: dict[Hashable, Coalescer[T, R]] = {}

    def submit(self, item: T) -> asyncio.Future[R]:
        k = self._key(item)
        queue = self._queues.get(k)
        if queue is None:
            queue = self._queues[k] = Coalescer(self._run, self._max)
        return queue.submit(item)


def _fail(waiters: list[tuple[T, asyncio.Future[R]]], error: Exception) -> None:
    for _, fut in waiters:
        if not fut.done():
            fut.set_exception(error)
