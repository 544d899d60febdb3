"""Account creation is limited per client address and friend requests per user, counted in
Redis (shared by every process): past a limit the answer is 429 ``rate_limited`` and
nothing is created. A dedicated server runs with low limits and believes
``X-Forwarded-For`` from 127.0.0.1, so each registration speaks from an address of its own
(documentation ranges) unless a test wants them together."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from im_server.client import ApiError, Client
from im_server.client.transport import HttpPool
from tests.support import PASSWORD, ServerProcess, Stores, new_addr

REGISTER_MAX, FRIEND_MAX = 3, 3


@pytest.fixture(scope="module")
def signup(stores: Stores) -> Iterator[ServerProcess]:
    env = {
        **stores.env(),
        "IM_REGISTER_ADDR_MAX": str(REGISTER_MAX),
        "IM_FRIEND_REQUEST_USER_MAX": str(FRIEND_MAX),
    }
    srv = ServerProcess(env=env).start()
    yield srv
    srv.terminate()


@pytest.fixture
async def http() -> AsyncIterator[HttpPool]:
    async with HttpPool(timeout=30) as h:
        yield h


async def register(http: HttpPool, url: str, addr: str) -> tuple[int, str]:
    name = f"su{uuid.uuid4().hex[:10]}"
    r = await http.post(
        url + "/v1/users",
        json={"username": name, "password": PASSWORD},
        headers={"X-Forwarded-For": addr},
    )
    if r.status_code != 201:
        assert r.status_code == 429, (r.status_code, r.text)
        assert r.json()["error"]["code"] == "rate_limited", r.text
    return r.status_code, name


async def user(http: HttpPool, url: str) -> Client:
    status, name = await register(http, url, new_addr())
    assert status == 201
    return await Client.login(url, name, PASSWORD)


async def test_registrations_per_address_are_limited(signup: ServerProcess, http: HttpPool) -> None:
    addr = new_addr()
    got = [await register(http, signup.url, addr) for _ in range(REGISTER_MAX + 2)]
    assert [s for s, _ in got] == [201] * REGISTER_MAX + [429, 429], got
    # a refused registration created nothing: its username is free and cannot log in
    for _, name in got[REGISTER_MAX:]:
        with pytest.raises(ApiError) as e:
            await Client.login(signup.url, name, PASSWORD)
        assert e.value.status == 401
    # bad input is refused as such, before anything is counted or hashed
    r = await http.post(
        signup.url + "/v1/users", json={"username": "x"}, headers={"X-Forwarded-For": addr}
    )
    assert r.status_code in (400, 422), r.text
    # another address is not limited by this one
    assert (await register(http, signup.url, new_addr()))[0] == 201


async def test_friend_requests_per_user_are_limited(signup: ServerProcess, http: HttpPool) -> None:
    me, other = await user(http, signup.url), await user(http, signup.url)
    targets = [await user(http, signup.url) for _ in range(FRIEND_MAX + 1)]
    try:
        for t in targets[:FRIEND_MAX]:
            await me.request_friend(int(t.user_id))  # type: ignore[arg-type]
        last = targets[FRIEND_MAX]
        with pytest.raises(ApiError) as e:
            await me.request_friend(int(last.user_id))  # type: ignore[arg-type]
        assert (e.value.status, e.value.code) == (429, "rate_limited"), e.value
        # the refused request created nothing, on either side
        assert (await last.friend_requests())["incoming"] == []
        outgoing = (await me.friend_requests())["outgoing"]
        assert sorted(r["to_user_id"] for r in outgoing) == sorted(
            t.user_id for t in targets[:FRIEND_MAX]
        )
        # another user is not limited by my requests
        await other.request_friend(int(last.user_id))  # type: ignore[arg-type]
        assert [r["from_user_id"] for r in (await last.friend_requests())["incoming"]] == [
            other.user_id
        ]
    finally:
        for c in [me, other, *targets]:
            await c.aclose()
