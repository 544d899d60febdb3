"""The loop the pusher and the thumbnail worker share (``workers/rounds.py``): a failing
round never ends it, a wake during a round is not lost, and stop does not wait for the
poll."""

from __future__ import annotations

import asyncio
import logging
import time

from im_server.workers.rounds import RoundWorker

log = logging.getLogger("test.rounds")


class Scripted(RoundWorker):
    """Rounds that do what ``script`` says, in turn: "fail", "work", "idle"; then idle."""

    def __init__(self, script: list[str], poll: float = 30.0) -> None:
        super().__init__(asyncio.Event(), log)
        self.script = script
        self.poll = poll
        self.starts: list[float] = []

    def poll_seconds(self) -> float:
        return self.poll

    async def round(self) -> bool:
        self.starts.append(time.monotonic())
        step = self.script.pop(0) if self.script else "idle"
        if step == "fail":
            raise RuntimeError("a bug in a round")
        if step == "wake":  # rows written while this round looked
            self.wake.set()
            return False
        return step == "work"


async def until(cond: object, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def test_a_failing_round_is_retried_after_a_backoff_and_the_loop_goes_on() -> None:
    w = Scripted(["fail", "fail", "work", "idle"])
    await w.start()
    await until(lambda: len(w.starts) >= 4)
    gaps = [b - a for a, b in zip(w.starts, w.starts[1:], strict=False)]
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps  # 0.5 s, then doubled
    assert gaps[2] < 0.3, "a round that worked is followed at once"
    await w.stop()


async def test_a_wake_during_a_round_starts_the_next_one_without_the_poll() -> None:
    w = Scripted(["wake", "idle"])
    await w.start()
    await until(lambda: len(w.starts) >= 2, timeout=2.0)  # the poll is 30 s
    await w.stop()


async def test_a_wake_while_idle_ends_the_sleep() -> None:
    w = Scripted([])
    await w.start()
    await until(lambda: len(w.starts) == 1)
    await asyncio.sleep(0.05)
    w.wake.set()
    await until(lambda: len(w.starts) == 2, timeout=2.0)
    await w.stop()


async def test_stop_does_not_wait_for_the_poll() -> None:
    w = Scripted([])
    await w.start()
    await until(lambda: len(w.starts) == 1)
    t0 = time.monotonic()
    await w.stop()
    assert time.monotonic() - t0 < 1.0
    assert w._task is not None and w._task.done()
