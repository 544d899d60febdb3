"""Periodic jobs: each at its own interval, a failing one keeps running (counted and
logged once per streak), and one job's failure or slowness never stops another."""

from __future__ import annotations

import asyncio
import logging

import pytest

from im_server import metrics
from im_server.workers.periodic import Periodic, stop_all
from tests.support import eventually


def _failures(job: str) -> float:
    return metrics.PERIODIC_FAILURES.labels(job)._value.get()


async def test_a_failing_job_keeps_running(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise ValueError(f"bug number {calls}")

    before = _failures("flaky")
    job = Periodic("flaky", 0.01, flaky)
    with caplog.at_level(logging.DEBUG, "im_server.periodic"):
        job.start()
        try:

            async def recovered() -> bool:
                return calls >= 5

            await eventually(recovered, timeout=5)
        finally:
            await job.stop()
    assert job.failures == 3 and job.runs >= 5
    assert _failures("flaky") == before + 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None  # one traceback per streak
    assert "works again after 3 failures" in caplog.text


async def test_a_store_failure_is_a_warning_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def down() -> None:
        raise ConnectionRefusedError(111, "refused")

    job = Periodic("down", 60, down)
    with caplog.at_level(logging.WARNING, "im_server.periodic"):
        assert await job.run_once() is False
        assert await job.run_once() is False  # the same streak: not logged again
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and rec.exc_info is None


async def test_each_job_keeps_its_own_pace() -> None:
    fast_runs = slow_runs = 0
    stuck = asyncio.Event()

    async def fast() -> None:
        nonlocal fast_runs
        fast_runs += 1

    async def slow() -> None:
        nonlocal slow_runs
        slow_runs += 1

    async def broken() -> None:
        raise RuntimeError("always")

    async def hangs() -> None:
        await stuck.wait()  # a store call that never answers

    jobs = [
        Periodic("fast", 0.01, fast),
        Periodic("slow", 30, slow),
        Periodic("broken", 0.01, broken),
        Periodic("hangs", 0.01, hangs),
    ]
    for j in jobs:
        j.start()
    try:

        async def fast_ran_often() -> bool:
            return fast_runs >= 10

        await eventually(fast_ran_often, timeout=5)
    finally:
        await stop_all(jobs)
    assert slow_runs == 1  # ran at start, next one 30 s later
    assert jobs[2].failures >= 1 and jobs[3].runs == 1


async def test_stop_cancels_a_job_in_flight() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    job = Periodic("forever", 1, forever)
    job.start()
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(job.stop(), 5)
    await job.stop()  # twice is fine
