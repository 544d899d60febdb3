"""Logins can't be brute-forced or tell which usernames exist: failed logins are counted
per username and per client address in Redis, and past a limit answered 429
``rate_limited`` (the right password too) until the window passes; an unknown username
costs what a wrong password costs.

A dedicated server runs with the product's own argon2 cost (the suite lowers it) and low
limits. The server believes ``X-Forwarded-For`` from 127.0.0.1 (its trusted proxy by
default), so each test speaks from addresses of its own (documentation ranges). The
users a test makes log in from the loopback address itself, whose counter the rest of the
suite shares (its failed logins count there too), so each test starts that counter at
zero."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from im_server.client import Client
from im_server.client.transport import HttpPool, Response
from im_server.config import Settings
from im_server.storage.redis import keys
from tests.support import PASSWORD, ServerProcess, Stores, metric, new_addr, new_user, rds

USER_MAX, ADDR_MAX = 5, 12
_DEFAULTS = Settings()
REAL_COST = {
    "IM_ARGON2_TIME_COST": str(_DEFAULTS.argon2_time_cost),
    "IM_ARGON2_MEMORY_KIB": str(_DEFAULTS.argon2_memory_kib),
    "IM_ARGON2_PARALLELISM": str(_DEFAULTS.argon2_parallelism),
}
LIMITS = {
    "IM_LOGIN_FAIL_USER_MAX": str(USER_MAX),
    "IM_LOGIN_FAIL_ADDR_MAX": str(ADDR_MAX),
    "IM_LOGIN_FAIL_WINDOW_SECONDS": "900",
}


@pytest.fixture(scope="module")
def guarded(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**stores.env(), **REAL_COST, **LIMITS}).start()
    yield srv
    srv.terminate()


@pytest.fixture(autouse=True)
async def loopback_uncounted(stores: Stores) -> None:
    """Failed logins elsewhere in the suite (fuzzing, wrong-password tests) count against
    127.0.0.1 in the shared Redis; with this module's low limit they would refuse the
    logins of the users the tests make."""
    async with rds(stores) as r:
        await r.delete(keys.login_fails_addr("127.0.0.1"), keys.login_fails_addr("::/64"))


@pytest.fixture
async def http() -> AsyncIterator[HttpPool]:
    async with HttpPool(timeout=60) as h:
        yield h


async def attempt(http: HttpPool, url: str, username: str, password: str, addr: str) -> Response:
    return await http.post(
        url + "/v1/sessions",
        json={"username": username, "password": password},
        headers={"X-Forwarded-For": addr},
    )


def statuses(rs: list[Response]) -> list[int]:
    return [r.status_code for r in rs]


def assert_throttled(r: Response) -> None:
    assert r.status_code == 429, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "rate_limited", r.text


async def test_a_burst_for_one_username_is_throttled_after_the_limit(
    guarded: ServerProcess, http: HttpPool
) -> None:
    victim = await new_user(guarded.url, "victim")
    addr = new_addr()
    try:
        burst = await asyncio.gather(
            *(
                attempt(http, guarded.url, victim.username or "", f"wrong-{i}", addr)
                for i in range(30)
            )
        )
        got = statuses(burst)
        # parallel attempts cannot slip past the limit: exactly USER_MAX were checked
        assert got.count(401) == USER_MAX and got.count(429) == 30 - USER_MAX, got
        for r in burst:
            if r.status_code == 429:
                assert_throttled(r)
        # the right password is refused too while throttled, from any address
        assert_throttled(await attempt(http, guarded.url, victim.username or "", PASSWORD, addr))
        assert_throttled(
            await attempt(http, guarded.url, victim.username or "", PASSWORD, new_addr())
        )
        # spelled another way, it is the same username
        upper = (victim.username or "").upper()
        assert_throttled(await attempt(http, guarded.url, upper, PASSWORD, new_addr()))
        # its existing token is not affected, and other users still log in from there
        assert (await victim.me())["user_id"] == victim.user_id
        other = await new_user(guarded.url, "other")
        ok = await attempt(http, guarded.url, other.username or "", PASSWORD, addr)
        assert ok.status_code == 200, ok.text
        await other.aclose()
    finally:
        await victim.aclose()


async def test_an_unknown_username_is_throttled_like_a_known_one(
    guarded: ServerProcess, http: HttpPool
) -> None:
    ghost = f"ghost{uuid.uuid4().hex[:10]}"
    got = [
        (await attempt(http, guarded.url, ghost, "wrong-password", new_addr())).status_code
        for _ in range(USER_MAX + 3)
    ]
    assert got == [401] * USER_MAX + [429] * 3, got


async def test_too_many_failures_from_one_address(guarded: ServerProcess, http: HttpPool) -> None:
    """Each username tried once (no username limit is reached), all from one address."""
    addr = new_addr()
    real = await new_user(guarded.url, "real")
    try:
        got = [
            (
                await attempt(http, guarded.url, f"nobody{uuid.uuid4().hex[:8]}", "x" * 10, addr)
            ).status_code
            for _ in range(ADDR_MAX + 3)
        ]
        assert got == [401] * ADDR_MAX + [429] * 3, got
        # a real user with the right password is refused from that address too ...
        assert_throttled(await attempt(http, guarded.url, real.username or "", PASSWORD, addr))
        # ... but not from another one
        ok = await attempt(http, guarded.url, real.username or "", PASSWORD, new_addr())
        assert ok.status_code == 200, ok.text
    finally:
        await real.aclose()


async def test_a_burst_of_usernames_from_one_address_is_throttled_after_the_limit(
    guarded: ServerProcess, http: HttpPool
) -> None:
    """Each username once, all at the same time, from one address: exactly ADDR_MAX are
    checked, however the attempts interleave on the two counters."""
    addr = new_addr()
    burst = await asyncio.gather(
        *(
            attempt(http, guarded.url, f"nobody{uuid.uuid4().hex[:8]}", "x" * 10, addr)
            for _ in range(ADDR_MAX + 10)
        )
    )
    got = statuses(burst)
    assert got.count(401) == ADDR_MAX and got.count(429) == 10, got
    for r in burst:
        if r.status_code == 429:
            assert_throttled(r)


async def test_a_successful_login_clears_the_username_count(
    guarded: ServerProcess, http: HttpPool
) -> None:
    me = await new_user(guarded.url, "clears")
    name = me.username or ""
    try:
        for _ in range(USER_MAX - 1):
            r = await attempt(http, guarded.url, name, "wrong-password", new_addr())
            assert r.status_code == 401, r.text
        ok = await attempt(http, guarded.url, name, PASSWORD, new_addr())
        assert ok.status_code == 200, ok.text
        got = [
            (await attempt(http, guarded.url, name, "wrong-password", new_addr())).status_code
            for _ in range(USER_MAX + 1)
        ]
        assert got == [401] * USER_MAX + [429], got
    finally:
        await me.aclose()


async def test_successful_logins_do_not_count_against_the_address(
    guarded: ServerProcess, http: HttpPool
) -> None:
    addr = new_addr()
    me = await new_user(guarded.url, "many")
    try:
        for _ in range(ADDR_MAX + 2):
            r = await attempt(http, guarded.url, me.username or "", PASSWORD, addr)
            assert r.status_code == 200, r.text
    finally:
        await me.aclose()


async def test_wrong_old_password_counts_as_a_failed_login(
    guarded: ServerProcess, http: HttpPool
) -> None:
    me = await new_user(guarded.url, "pwthrottle")
    try:
        got = []
        for _ in range(USER_MAX + 1):
            r = await http.put(
                guarded.url + "/v1/me/password",
                json={"old_password": "wrong-password", "new_password": "new-password-1"},
                headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": new_addr()},
            )
            got.append(r.status_code)
        assert got == [401] * USER_MAX + [429], got
        # the right old password is refused too, and so is a login
        r = await http.put(
            guarded.url + "/v1/me/password",
            json={"old_password": PASSWORD, "new_password": "new-password-1"},
            headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": new_addr()},
        )
        assert_throttled(r)
        assert_throttled(await attempt(http, guarded.url, me.username or "", PASSWORD, new_addr()))
        assert (await me.me())["user_id"] == me.user_id  # the session itself lives on
    finally:
        await me.aclose()


async def test_wrong_password_on_account_deletion_counts_as_a_failed_login(
    guarded: ServerProcess, http: HttpPool
) -> None:
    me = await new_user(guarded.url, "delthrottle")
    try:
        got = []
        for _ in range(USER_MAX + 1):
            r = await http.request(
                "DELETE",
                guarded.url + "/v1/me",
                json={"password": "wrong-password"},
                headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": new_addr()},
            )
            got.append(r.status_code)
        assert got == [401] * USER_MAX + [429], got
        # the right password is refused too (nothing deleted), and so is a login
        r = await http.request(
            "DELETE",
            guarded.url + "/v1/me",
            json={"password": PASSWORD},
            headers={"Authorization": f"Bearer {me.token}", "X-Forwarded-For": new_addr()},
        )
        assert_throttled(r)
        assert_throttled(await attempt(http, guarded.url, me.username or "", PASSWORD, new_addr()))
        assert (await me.me())["user_id"] == me.user_id  # not deleted
    finally:
        await me.aclose()


async def test_unknown_usernames_take_as_long_as_wrong_passwords(
    guarded: ServerProcess, http: HttpPool
) -> None:
    """Medians over 10 tries each, interleaved, at the product's argon2 cost: an unknown
    username is verified against a dummy hash of the same cost."""
    known = [await new_user(guarded.url, "timed") for _ in range(10)]
    # one unknown-username login first: the dummy hash is made lazily, once per process
    await attempt(http, guarded.url, f"warm{uuid.uuid4().hex[:8]}", "wrong-password", new_addr())
    times: dict[str, list[float]] = {"known": [], "unknown": []}
    try:
        for c in known:
            for kind in ("known", "unknown"):
                name = c.username if kind == "known" else f"nobody{uuid.uuid4().hex[:10]}"
                t0 = time.perf_counter()
                r = await attempt(http, guarded.url, name or "", "wrong-password", new_addr())
                times[kind].append(time.perf_counter() - t0)
                assert r.status_code == 401, r.text
        known_ms = statistics.median(times["known"]) * 1000
        unknown_ms = statistics.median(times["unknown"]) * 1000
        print(
            f"\nlogin medians: known user, wrong password {known_ms:.1f} ms; "
            f"unknown user {unknown_ms:.1f} ms (ratio {unknown_ms / known_ms:.2f})"
        )
        assert 0.5 <= unknown_ms / known_ms <= 2.0, times
        assert known_ms > 5, "argon2 at the product's cost should take longer than this"
    finally:
        for c in known:
            await c.aclose()


# -- Redis down: logins go on, unthrottled, and it is counted -----------------------------------


async def test_logins_work_while_redis_is_down(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv = ServerProcess(env={**stores.env(), **LIMITS}).start()
    try:
        me = await new_user(srv.url, "nored")
        stores.redis.stop()
        before = metric(srv.url, "im_login_throttle_unavailable_total")
        again = await Client.login(srv.url, me.username or "", PASSWORD)
        assert (await again.me())["user_id"] == me.user_id
        async with HttpPool(timeout=30) as h:
            bad: list[Any] = [
                (await attempt(h, srv.url, me.username or "", "wrong", "203.0.113.9")).status_code
                for _ in range(USER_MAX + 2)
            ]
        assert bad == [401] * (USER_MAX + 2), bad  # unthrottled, but still refused
        assert metric(srv.url, "im_login_throttle_unavailable_total") >= before + 1
        assert "login throttle unavailable" in srv.log_tail(200)
        await again.aclose()
        await me.aclose()
    finally:
        srv.terminate()
        stores.stop()
