"""Username lookups can't walk the user base: every lookup, found or not, is counted per
caller and per client address in Redis, shared by every process; past a limit the
answer is 429 ``rate_limited`` until the window passes, for names that exist too.

A dedicated server runs with low limits and believes ``X-Forwarded-For`` from 127.0.0.1
(its trusted proxy by default), so each test speaks from addresses of its own
(documentation ranges)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from im_server.client import Client
from im_server.client.transport import HttpPool, Response
from tests.support import ServerProcess, Stores, befriend, metric, new_addr, new_user

USER_MAX, ADDR_MAX = 5, 8
LIMITS = {
    "IM_LOOKUP_USER_MAX": str(USER_MAX),
    "IM_LOOKUP_ADDR_MAX": str(ADDR_MAX),
    "IM_LOOKUP_WINDOW_SECONDS": "900",
}


@pytest.fixture(scope="module")
def counted(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**stores.env(), **LIMITS}).start()
    yield srv
    srv.terminate()


@pytest.fixture
async def http() -> AsyncIterator[HttpPool]:
    async with HttpPool(timeout=30) as h:
        yield h


async def lookup(http: HttpPool, url: str, me: Client, username: str, addr: str) -> Response:
    return await http.get(
        url + "/v1/users/lookup",
        params={"username": username},
        headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": addr},
    )


def assert_throttled(r: Response) -> None:
    assert r.status_code == 429, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "rate_limited", r.text


async def test_a_user_past_the_limit_is_refused_found_or_not(
    counted: ServerProcess, http: HttpPool
) -> None:
    me = await new_user(counted.url, "looker")
    known = await new_user(counted.url, "known")
    try:
        got = []
        for i in range(USER_MAX):
            name = (known.username or "") if i % 2 else f"nobody{uuid.uuid4().hex[:8]}"
            got.append((await lookup(http, counted.url, me, name, new_addr())).status_code)
        assert got == [404, 200, 404, 200, 404], got
        # a name that exists is refused too, and so it is from any other address
        assert_throttled(await lookup(http, counted.url, me, known.username or "", new_addr()))
        assert_throttled(await lookup(http, counted.url, me, "nobody", new_addr()))
        # another user still finds people
        r = await lookup(http, counted.url, known, me.username or "", new_addr())
        assert r.status_code == 200 and r.json()["user_id"] == me.user_id, r.text
    finally:
        await me.aclose()
        await known.aclose()


async def profile(http: HttpPool, url: str, me: Client, uid: int, addr: str) -> Response:
    return await http.get(
        f"{url}/v1/users/{uid}",
        headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": addr},
    )


async def test_profiles_of_strangers_share_the_lookup_budget(
    counted: ServerProcess, http: HttpPool
) -> None:
    """``GET /v1/users/{id}`` can't walk the (sequential) ids either: a stranger's profile,
    or an id that names nobody, spends a lookup; the profiles of people I share a
    friendship, a pending request or a group with, and my own, spend nothing."""
    me, friend, asker, mate, stranger = [
        await new_user(counted.url, p) for p in ("walker", "friend", "asker", "mate", "stranger")
    ]
    try:
        await befriend(me, friend)
        await asker.request_friend(int(me.user_id))  # type: ignore[arg-type]
        await mate.create_group("g", [int(me.user_id)])  # type: ignore[arg-type]
        free = [me, friend, asker, mate]
        # the free ones, many times over the budget: all answered, nothing spent
        for _ in range(2):
            for c in free:
                r = await profile(http, counted.url, me, int(c.user_id), new_addr())  # type: ignore[arg-type]
                assert r.status_code == 200 and r.json()["user_id"] == c.user_id, r.text
        assert (await lookup(http, counted.url, me, "nobody", new_addr())).status_code == 404
        # strangers, existing or not, spend the rest of the budget (one lookup spent above)
        got = []
        base = int(stranger.user_id)  # type: ignore[arg-type]
        for i in range(USER_MAX - 1):
            uid = base if i == 0 else base + 10_000 + i
            got.append((await profile(http, counted.url, me, uid, new_addr())).status_code)
        assert got == [200] + [404] * (USER_MAX - 2), got
        # past it: strangers' profiles and lookups are refused, friends' still answer
        assert_throttled(await profile(http, counted.url, me, base, new_addr()))
        assert_throttled(await profile(http, counted.url, me, base + 1, new_addr()))
        assert_throttled(await lookup(http, counted.url, me, stranger.username or "", new_addr()))
        for c in free:
            r = await profile(http, counted.url, me, int(c.user_id), new_addr())  # type: ignore[arg-type]
            assert r.status_code == 200, r.text
    finally:
        for c in (me, friend, asker, mate, stranger):
            await c.aclose()


async def test_a_parallel_burst_is_counted_exactly(counted: ServerProcess, http: HttpPool) -> None:
    me = await new_user(counted.url, "burst")
    try:
        addr = new_addr()
        burst = await asyncio.gather(
            *(
                lookup(http, counted.url, me, f"n{i}x{uuid.uuid4().hex[:6]}", addr)
                for i in range(20)
            )
        )
        codes = [r.status_code for r in burst]
        assert codes.count(404) == USER_MAX and codes.count(429) == 20 - USER_MAX, codes
    finally:
        await me.aclose()


async def test_many_users_from_one_address_are_counted_together(
    counted: ServerProcess, http: HttpPool
) -> None:
    addr = new_addr()
    users = [await new_user(counted.url, "farm") for _ in range(3)]
    try:
        got = [
            (
                await lookup(http, counted.url, users[i % 3], f"z{uuid.uuid4().hex[:8]}", addr)
            ).status_code
            for i in range(ADDR_MAX + 2)
        ]
        assert got == [404] * ADDR_MAX + [429] * 2, got
        # the same users from another address are not refused by the first one's count
        r = await lookup(http, counted.url, users[0], users[1].username or "", new_addr())
        assert r.status_code == 200, r.text
    finally:
        for u in users:
            await u.aclose()


async def test_bad_names_are_refused_before_anything_is_counted(
    counted: ServerProcess, http: HttpPool
) -> None:
    """A query FastAPI refuses (empty, too long) never reaches the counters."""
    me = await new_user(counted.url, "badq")
    try:
        addr = new_addr()
        for _ in range(USER_MAX + 2):
            r = await lookup(http, counted.url, me, "", addr)
            assert r.status_code in (400, 422), r.text
        r = await lookup(http, counted.url, me, "nobody-here", addr)
        assert r.status_code in (400, 404), r.text
    finally:
        await me.aclose()


async def test_lookups_go_on_uncounted_while_redis_is_down(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv = ServerProcess(env={**stores.env(), **LIMITS}).start()
    try:
        me = await new_user(srv.url, "down")
        other = await new_user(srv.url, "other")
        stores.redis.stop()
        async with HttpPool(timeout=30) as h:
            for _ in range(USER_MAX + 2):
                r = await lookup(h, srv.url, me, other.username or "", new_addr())
                assert r.status_code == 200, r.text
        assert metric(srv.url, 'im_quota_unavailable_total{what="lookup"}') >= USER_MAX + 2
        assert "lookup quota unavailable" in srv.log_tail(200)
        await me.aclose()
        await other.aclose()
    finally:
        srv.terminate()
        stores.stop()
