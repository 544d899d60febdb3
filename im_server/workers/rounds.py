"""What the workers that drain durable rows in rounds share (the pusher, the thumbnail
worker): one task that runs a round, sleeps until woken or polled when a round found
nothing, and backs off exponentially while a store fails, without ever dying of an
error. The rows themselves are leased by each worker's storage calls, so a process
killed mid-round leaves nothing that another cannot take over."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from im_server.errors import is_store_error

BACKOFF_MIN_S = 0.5


class RoundWorker:
    """Subclasses give :meth:`round` (True when it found work) and the settings below;
    ``wake`` is the event that says rows are due (set by whoever wrote them)."""

    name = "worker"

    def __init__(self, wake: asyncio.Event, log: logging.Logger) -> None:
        self.wake = wake
        self.log = log
        self._stop = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    # -- what a worker sets ------------------------------------------------------------
    async def round(self) -> bool:
        raise NotImplementedError

    def poll_seconds(self) -> float:
        """How long to sleep after a round that found nothing, unless woken."""
        return 1.0

    def backoff_max_seconds(self) -> float:
        return 30.0

    def round_interval_seconds(self) -> float:
        """The least time from one round's start to the next: a busy moment's rows are
        taken in fewer, larger rounds."""
        return 0.0

    def pause_after_round(self) -> float:
        """A pause after a round that worked (the pusher's while its gateway fails)."""
        return 0.0

    # -- the loop ------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        backoff = BACKOFF_MIN_S
        started = -self.round_interval_seconds()
        while not self._stop.is_set():
            wait = started + self.round_interval_seconds() - time.monotonic()
            if wait > 0:
                await self.sleep(wait)
                if self._stop.is_set():
                    break
            started = time.monotonic()
            # cleared before the round looks: a wake during the round is kept for after it
            self.wake.clear()
            try:
                worked = await self.round()
                backoff = BACKOFF_MIN_S
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a store is down (or a bug): retry later
                if is_store_error(e):
                    self.log.warning("%s: %r; retrying in %.1f s", self.name, e, backoff)
                else:
                    self.log.exception("%s round failed; retrying in %.1f s", self.name, backoff)
                await self.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_seconds())
                continue
            pause = self.pause_after_round()
            if pause > 0:
                await self.sleep(pause)
            elif not worked:
                await self.sleep(self.poll_seconds(), wake=self.wake)

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, less when stopped or when ``wake`` is set."""
        waits = [asyncio.ensure_future(self._stop.wait())]
        if wake is not None:
            waits.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
