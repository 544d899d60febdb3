"""The queue of frames to other processes is bounded: under a Redis slower than the
sends, the oldest frames are shed and counted (their devices catch up by sync), and
memory stops growing. No store is needed: nothing is published here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from im_server import metrics
from im_server.app import build_context
from im_server.config import Settings
from im_server.gateway import fanout as fanout_mod
from im_server.gateway.fanout import Fanout
from im_server.gateway.hub import Hub


@pytest.fixture
async def fanout() -> AsyncIterator[Fanout]:
    settings = Settings(
        database_url="postgresql+asyncpg://nobody@127.0.0.1:9/none",
        redis_url="redis://127.0.0.1:9",
    )
    ctx = build_context(settings)
    f = Fanout(ctx, Hub(), ctx.redis)
    f.others = True  # another process is alive: frames queue for it (never published)
    yield f
    await ctx.redis.close()
    await ctx.db.dispose()


def test_the_oldest_frames_are_shed_past_the_bound(
    fanout: Fanout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout_mod, "OUTBOX_MAX_RECIPIENTS", 100)
    shed_before = metrics.FANOUT_SHED._value.get()
    for i in range(60):
        fanout.push([1, 2], f"frame {i}")  # 120 recipients in all
    assert fanout._queued <= 100
    assert sum(len(u) for u, _ in fanout._outbox) == fanout._queued
    texts = [t for _, t in fanout._outbox]
    assert texts[-1] == "frame 59" and texts[0] == f"frame {60 - len(texts)}"  # oldest went
    assert metrics.FANOUT_SHED._value.get() - shed_before == 120 - fanout._queued


def test_a_batch_takes_the_oldest_and_keeps_the_count(fanout: Fanout) -> None:
    for i in range(5):
        fanout.push(list(range(1000)), f"big {i}")
    batch = fanout._take_batch()
    assert [t for _, t in batch] == ["big 0", "big 1"]  # up to PUBLISH_BATCH recipients
    assert fanout._queued == 3000 == sum(len(u) for u, _ in fanout._outbox)
