"""Per-user rate limits hold for the user as a whole with several server processes
(the contract's Operations section): a user whose requests reach two processes gets the
burst once, not once per process. The shared buckets live in Redis
(``storage/redis/rate_ops.py``) and count once other processes serve."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from im_server.client import ApiError, Client
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    linked_servers,
    new_user,
)

RATE, BURST = 2.0, 10
MAX_CONNS = 3


@pytest.fixture(scope="module")
def two(stores: Stores) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {
        **stores.env(),
        "IM_RATE_SEND_PER_S": str(RATE),
        "IM_RATE_SEND_BURST": str(BURST),
        "IM_RATE_SEARCH_PER_S": str(RATE),
        "IM_RATE_SEARCH_BURST": str(BURST),
        "IM_MAX_CONNECTIONS_PER_USER": str(MAX_CONNS),
    }
    with linked_servers(env, "lim-1", "lim-2") as pair:
        yield pair


async def _on_both(s1: ServerProcess, s2: ServerProcess) -> tuple[Client, Client, str]:
    a = await new_user(s1.url, "la")
    b = await new_user(s1.url, "lb")
    conv = await befriend(a, b)
    a2 = await Client.login(s2.url, str(a.username), PASSWORD, device_id="second")
    return a, a2, conv


async def test_sends_through_two_processes_share_one_bucket(
    two: tuple[ServerProcess, ServerProcess],
) -> None:
    a, a2, conv = await _on_both(*two)
    ok, refused = 0, 0
    async with a2:
        started = time.monotonic()
        for i in range(2 * BURST):  # alternating: each process alone would take them all
            try:
                await (a if i % 2 == 0 else a2).send_rest(conv, f"m{i}")
                ok += 1
            except ApiError as e:
                assert (e.status, e.code) == (429, "rate_limited"), e
                refused += 1
        elapsed = time.monotonic() - started
    assert refused > 0, "the burst was granted once per process"
    assert BURST <= ok <= BURST + int(elapsed * RATE) + 1, (ok, elapsed)


async def test_searches_through_two_processes_share_one_bucket(
    two: tuple[ServerProcess, ServerProcess],
) -> None:
    a, a2, _conv = await _on_both(*two)
    ok = 0
    async with a2:
        started = time.monotonic()
        for i in range(2 * BURST):
            try:
                await (a if i % 2 == 0 else a2).search("hello")
                ok += 1
            except ApiError as e:
                assert e.code == "rate_limited", e
        elapsed = time.monotonic() - started
    assert ok <= BURST + int(elapsed * RATE) + 1, (ok, elapsed)


async def test_the_socket_cap_counts_the_sockets_on_every_process(
    two: tuple[ServerProcess, ServerProcess],
) -> None:
    a, a2, _conv = await _on_both(*two)
    async with a2:
        held = [await a.connect(), await a.connect(), await a2.connect()]  # 2 + 1: the cap
        for c in held:
            await c.ping()
        # a fourth, on either process, is refused (each alone holds fewer than the cap)
        for client in (a2, a):
            extra = await client.connect()
            assert await extra.wait_closed(5) == 1008
        for c in held:
            await c.ping()
            assert not c.closed.is_set()
        # a socket closed on one process frees a place for the other
        await held[0].close()

        async def reconnects() -> bool:
            c = await a2.connect()
            try:
                await c.wait_closed(0.5)
            except TimeoutError:  # still open: accepted
                held.append(c)
                return True
            return False

        assert await eventually(reconnects, timeout=10)
        for c in held[1:]:
            await c.close()
