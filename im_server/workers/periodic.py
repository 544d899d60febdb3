"""Named background jobs that run at their own interval. Each job is its own task, so a
job that fails (or hangs on a store) never stops or delays the others; a failure is
counted (``im_periodic_failures_total{job}``) and logged once per streak of the same
error (with a traceback when it is not a store failure: a bug), and the job runs again
at its next tick."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from im_server import metrics
from im_server.errors import is_store_error

log = logging.getLogger("im_server.periodic")


class Periodic:
    """Runs ``fn`` now, then ``interval`` seconds after each run ends, until stopped."""

    def __init__(self, name: str, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval = interval
        self.fn = fn
        self.runs = 0
        self.failures = 0
        self._streak = 0  # failures in a row
        self._last_error: type[BaseException] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed = metrics.PERIODIC_FAILURES.labels(name)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"periodic-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run_once(self) -> bool:
        """One run; True when it succeeded."""
        self.runs += 1
        try:
            await self.fn()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # counted and logged; the job runs again next tick
            self.failures += 1
            self._streak += 1
            self._failed.inc()
            repeat, self._last_error = type(e) is self._last_error, type(e)
            if self._streak > 1 and repeat:
                log.debug("periodic job %s failed again: %r", self.name, e)
            elif is_store_error(e):
                log.warning("periodic job %s failed: %r", self.name, e)
            else:
                log.exception("periodic job %s failed", self.name)
            return False
        if self._streak:
            log.info("periodic job %s works again after %d failures", self.name, self._streak)
            self._streak = 0
        return True

    async def _loop(self) -> None:
        while True:
            await self.run_once()
            await asyncio.sleep(self.interval)


async def stop_all(jobs: list[Periodic]) -> None:
    await asyncio.gather(*(j.stop() for j in jobs))
