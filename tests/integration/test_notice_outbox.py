"""Notices driven from durable state: a reaction (or a membership change) and its notice
are written in one transaction; the notice reaches the seq stream exactly once even when
its send after the commit fails on a store, or the process is killed (-9) between the
commit and the send (another process's outbox sweep sends it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from im_server.client import Client
from tests.support import (
    ServerProcess,
    Stores,
    befriend,
    eventually,
    linked_servers,
    metric,
    new_user,
    persisted,
    pg,
    rds,
    send_ok,
)

FAST_SWEEP = {"IM_OUTBOX_SWEEP_SECONDS": "1"}


@pytest.fixture(scope="module")
def own_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """Stores of this module alone: the tests pause Redis writes."""
    stores = Stores.start(Path(tmp_path_factory.mktemp("outbox")))
    try:
        yield stores
    finally:
        stores.stop()


async def _notices(c: Client, conv: str, ctype: str) -> list[dict[str, Any]]:
    hist = await c.history(conv, limit=100)
    return [m for m in hist["messages"] if m["content_type"] == ctype]


async def _outbox_rows(stores: Stores) -> int:
    async with pg(stores) as conn:
        return int(await conn.fetchval("SELECT count(*) FROM notice_outbox"))


async def _announced_once(c: Client, conv: str, stores: Stores, content: dict[str, Any]) -> None:
    """The outbox empties, and once everything queued before a later message is
    persisted, history holds the notice exactly once."""

    async def empty() -> bool:
        return await _outbox_rows(stores) == 0

    await eventually(empty, timeout=30)
    later = await send_ok(c, conv, "after the notice")
    await persisted(c, conv, later)
    got = await _notices(c, conv, "reaction")
    assert [m["content"] for m in got] == [content], got
    assert got[0]["seq"] < later


@contextlib.asynccontextmanager
async def _writes_paused(stores: Stores, ms: int) -> Any:
    """Redis accepts no write (the send script included) for ``ms``: a send waiting on it
    times out like one to a Redis that is down."""
    async with rds(stores) as r:
        await r.execute_command("CLIENT", "PAUSE", str(ms), "WRITE")
        try:
            yield
        finally:
            await r.execute_command("CLIENT", "UNPAUSE")


async def test_a_reaction_whose_notice_send_failed_is_announced_once_by_the_sweep(
    own_stores: Stores,
) -> None:
    env = {**own_stores.env(), **FAST_SWEEP, "IM_STORE_TIMEOUT_SECONDS": "1"}
    srv = ServerProcess(env=env).start()
    try:
        a, b = await new_user(srv.url, "oa"), await new_user(srv.url, "ob")
        conv = await befriend(a, b)
        seq = await send_ok(a, conv, "react to me")
        await persisted(a, conv, seq)
        deferred = await asyncio.to_thread(metric, srv.url, "im_outbox_deferred_total")

        async with _writes_paused(own_stores, 20_000):
            await a.react(conv, seq, "👍")  # committed; its notice cannot be sent now
            hist = await a.history(conv, begin=seq, end=seq)
            assert hist["messages"][0]["reactions"] == [{"emoji": "👍", "count": 1, "mine": True}]
            assert await _outbox_rows(own_stores) == 1, "the notice waits in the outbox"
            after = await asyncio.to_thread(metric, srv.url, "im_outbox_deferred_total")
            assert after == deferred + 1

        await _announced_once(
            a, conv, own_stores, {"seq": seq, "emoji": "👍", "user_id": a.user_id, "op": "add"}
        )
        for c in (a, b):
            await c.aclose()
    finally:
        srv.terminate()


async def test_a_notice_left_by_a_process_killed_after_its_commit_is_sent_by_another(
    own_stores: Stores,
) -> None:
    """kill -9 between the commit and the send: the reaction's request is stuck on its
    send (Redis writes paused) when its process dies; the other process's sweep sends
    the notice, once."""
    # no send rate limit: with two processes its shared bucket is a Redis write, which
    # the pause would hold before the reaction's commit, the moment this test is about
    env = {
        **own_stores.env(),
        **FAST_SWEEP,
        "IM_STORE_TIMEOUT_SECONDS": "60",
        "IM_RATE_SEND_PER_S": "0",
    }
    with linked_servers(env, "outbox-1", "outbox-2") as (s1, s2):
        a = await new_user(s1.url, "ka")
        b = await new_user(s2.url, "kb")
        conv = await befriend(a, b)
        seq = await send_ok(a, conv, "react to me")
        await persisted(a, conv, seq)
        react: asyncio.Task[None] | None = None
        async with _writes_paused(own_stores, 30_000):
            react = asyncio.create_task(a.react(conv, seq, "🎉"))

            async def written() -> bool:
                return await _outbox_rows(own_stores) == 1

            await eventually(written, timeout=10)  # committed, its send waiting
            s1.kill9()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(react, 10)
        await _announced_once(
            b, conv, own_stores, {"seq": seq, "emoji": "🎉", "user_id": a.user_id, "op": "add"}
        )
        hist = await b.history(conv, begin=seq, end=seq)
        assert hist["messages"][0]["reactions"] == [{"emoji": "🎉", "count": 1, "mine": False}]
        for c in (a, b):
            await c.aclose()
