"""Which devices hold an open WebSocket, on any process (``RedisStore.connected_devices``,
what the pusher asks before pushing to a phone): device granularity (a user's laptop
connected does not hide its phone), any number of sockets per device, on any number of
processes, and the node-liveness rule of presence (a killed process's devices stop
counting once its node entry expired). The servers run with short presence timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from im_server.client import Client, open_connection
from im_server.client.socket import ws_url
from im_server.storage.redis import keys
from im_server.storage.redis.store import DEVICES_CHUNK, RedisStore
from tests.support import PASSWORD, ServerProcess, Stores, eventually, linked_servers, new_user, rds

NODE_TTL_S = 2.0
FAST = {
    "IM_PRESENCE_BEAT_SECONDS": "0.2",
    "IM_PRESENCE_NODE_TTL_SECONDS": str(NODE_TTL_S),
    "IM_PRESENCE_SWEEP_SECONDS": "0.2",
    "IM_PRESENCE_OFFLINE_GRACE_SECONDS": "1.0",
}
TIMEOUT = 8.0  # a record is one batch of the tracker away; room for a busy CI


@pytest.fixture(scope="module")
def nodes(
    stores: Stores, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    logs = tmp_path_factory.mktemp("dlogs")
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(logs)}
    with linked_servers(env, "dnode-1", "dnode-2") as pair:
        yield pair


@pytest.fixture
async def store(stores: Stores) -> AsyncIterator[RedisStore]:
    r = RedisStore(stores.redis.url, dedupe_ttl=60)
    try:
        yield r
    finally:
        await r.close()


def uid(c: Client) -> int:
    return int(c.user_id or 0)


async def login(url: str, user: Client, device: str) -> Client:
    return await Client.login(url, str(user.username), PASSWORD, device_id=device)


def listed(store: RedisStore, user: Client, want: set[str]) -> Any:
    async def check() -> bool:
        return (await store.connected_devices([uid(user)])) == {uid(user): want}

    return check


async def settled(store: RedisStore, user: Client, url: str, want: set[str]) -> None:
    """Wait until ``want`` is listed, after a probe device of the user connected to and
    left ``url``: the probe's records follow the close or open just made there, so a
    wrong record of it would show by then."""
    probe = await login(url, user, "probe")
    try:
        conn = await probe.connect()
        await eventually(listed(store, user, want | {"probe"}), timeout=TIMEOUT)
        await conn.close()
        await eventually(listed(store, user, want), timeout=TIMEOUT)
    finally:
        await probe.aclose()


async def test_only_the_connected_device_is_listed(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore
) -> None:
    s1, _ = nodes
    a = await new_user(s1.url, "dv")
    phone = await login(s1.url, a, "phone")  # logged in, no socket: a phone in a pocket
    laptop = await login(s1.url, a, "laptop")
    other = await new_user(s1.url, "dvo")
    try:
        assert await store.connected_devices([uid(a)]) == {uid(a): set()}
        await laptop.connect()
        await other.connect()
        await eventually(listed(store, a, {"laptop"}), timeout=TIMEOUT)
        await eventually(listed(store, other, {str(other.device_id)}), timeout=TIMEOUT)
        assert await store.connected_devices([uid(a), uid(other)]) == {
            uid(a): {"laptop"},
            uid(other): {str(other.device_id)},
        }
        # the phone comes up while the laptop stays: both (the user was online already)
        pc = await phone.connect()
        await eventually(listed(store, a, {"laptop", "phone"}), timeout=TIMEOUT)
        await pc.close()
        await eventually(listed(store, a, {"laptop"}), timeout=TIMEOUT)
    finally:
        for c in (a, phone, laptop, other):
            await c.aclose()


async def test_sockets_of_one_device_are_counted(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore
) -> None:
    s1, _ = nodes
    a = await new_user(s1.url, "ds")
    laptop = await login(s1.url, a, "laptop")
    try:
        first = await laptop.connect()
        second = await laptop.connect()
        await eventually(listed(store, a, {"laptop"}), timeout=TIMEOUT)
        await first.close()  # one of the two: still listed
        await settled(store, a, s1.url, {"laptop"})
        await second.close()  # the last one
        await eventually(listed(store, a, set()), timeout=TIMEOUT)
        again = await laptop.connect()  # a reconnect lists it again
        await eventually(listed(store, a, {"laptop"}), timeout=TIMEOUT)
        await again.close()
        await eventually(listed(store, a, set()), timeout=TIMEOUT)
    finally:
        for c in (a, laptop):
            await c.aclose()


async def test_a_device_on_two_processes(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore, stores: Stores
) -> None:
    s1, s2 = nodes
    a = await new_user(s1.url, "d2")
    laptop = await login(s1.url, a, "laptop")
    try:
        here = await laptop.connect()  # on process 1
        there = await open_connection(ws_url(s2.url, laptop.token))  # the same token, on 2
        async with rds(stores) as r:

            async def on_both() -> bool:
                entry = await r.hgetall(keys.presence_devices(uid(a)))
                return entry == {"dnode-1": "laptop", "dnode-2": "laptop"}

            await eventually(on_both, timeout=TIMEOUT)
        assert await store.connected_devices([uid(a)]) == {uid(a): {"laptop"}}
        await here.close()
        await settled(store, a, s1.url, {"laptop"})  # process 2 still holds it
        await there.close()
        await eventually(listed(store, a, set()), timeout=TIMEOUT)
        async with rds(stores) as r:
            assert not await r.exists(keys.presence_devices(uid(a)))  # nothing left behind
    finally:
        for c in (a, laptop):
            await c.aclose()


async def test_killed_process_devices_stop_counting(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore, stores: Stores, tmp_path: Any
) -> None:
    s1, _ = nodes
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(tmp_path)}
    s3 = ServerProcess(env={**env, "IM_NODE_NAME": "dnode-doomed"}).start()
    a = await new_user(s1.url, "dk")
    doomed = await login(s3.url, a, "doomed")
    alive = await login(s1.url, a, "alive")
    b = await new_user(s1.url, "dkb")  # another user, whose only socket is on the doomed one
    b3 = await login(s3.url, b, "b-doomed")
    try:
        await doomed.connect()
        await alive.connect()
        await b3.connect()
        await eventually(listed(store, a, {"doomed", "alive"}), timeout=TIMEOUT)
        await eventually(listed(store, b, {"b-doomed"}), timeout=TIMEOUT)
        s3.kill9()
        killed = asyncio.get_running_loop().time()
        await eventually(listed(store, a, {"alive"}), timeout=NODE_TTL_S + TIMEOUT)
        await eventually(listed(store, b, set()), timeout=NODE_TTL_S + TIMEOUT)
        took = asyncio.get_running_loop().time() - killed
        assert took < NODE_TTL_S + TIMEOUT, took
        # the sweep takes the dead node's entries away (the readers skipped them already)
        async with rds(stores) as r:

            async def swept() -> bool:
                entry = await r.hgetall(keys.presence_devices(uid(a)))
                gone = not await r.exists(keys.presence_devices(uid(b)))
                return gone and entry == {"dnode-1": "alive"}

            await eventually(swept, timeout=TIMEOUT)
        # the phone reconnects, to the live process: listed again
        back = await login(s1.url, a, "doomed")
        try:
            await back.connect()
            await eventually(listed(store, a, {"doomed", "alive"}), timeout=TIMEOUT)
        finally:
            await back.aclose()
        await eventually(listed(store, a, {"alive"}), timeout=TIMEOUT)
    finally:
        s3.kill9()
        for c in (a, doomed, alive, b, b3):
            await c.aclose()


async def test_restart_under_same_name_drops_old_devices(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore, stores: Stores, tmp_path: Any
) -> None:
    """A process killed and started again under the same node name (before its node entry
    could expire) must not keep its earlier devices listed; new sockets on it count."""
    s1, _ = nodes
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(tmp_path)}
    env["IM_PRESENCE_NODE_TTL_SECONDS"] = "600"  # only the restart can clear them
    name = "dnode-phoenix"
    s3 = ServerProcess(env={**env, "IM_NODE_NAME": name}).start()
    a = await new_user(s1.url, "dr")
    phone = await login(s3.url, a, "phone")
    try:
        await phone.connect()
        await eventually(listed(store, a, {"phone"}), timeout=TIMEOUT)
        s3.kill9()
        s3 = ServerProcess(env={**env, "IM_NODE_NAME": name}).start()
        await eventually(listed(store, a, set()), timeout=TIMEOUT)
        # the phone reconnects to the restarted process (on its new port)
        back = await open_connection(ws_url(s3.url, phone.token))
        await eventually(listed(store, a, {"phone"}), timeout=TIMEOUT)
        await back.close()
    finally:
        s3.kill9()
        for c in (a, phone):
            await c.aclose()


async def test_revoked_session_leaves_the_list(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore
) -> None:
    s1, s2 = nodes
    a = await new_user(s1.url, "dx")
    phone = await login(s2.url, a, "phone")
    try:
        await phone.connect()
        await eventually(listed(store, a, {"phone"}), timeout=TIMEOUT)
        await a.revoke_session("phone")  # from the other device: its sockets are closed
        await eventually(listed(store, a, set()), timeout=TIMEOUT)
    finally:
        for c in (a, phone):
            await c.aclose()


async def test_many_users_in_one_call(
    nodes: tuple[ServerProcess, ServerProcess], store: RedisStore
) -> None:
    """Many users asked at once (more than one chunk): each one answered, connected or not,
    repeats once; unknown ids get an empty set."""
    s1, s2 = nodes
    users = await asyncio.gather(*(new_user(s1.url, "dm") for _ in range(6)))
    devices: list[Client] = []
    try:
        for i, u in enumerate(users[:4]):  # two left without a socket
            devices.append(await login((s1, s2)[i % 2].url, u, f"d{i}"))
            await devices[-1].connect()
        want = {uid(u): ({f"d{i}"} if i < 4 else set()) for i, u in enumerate(users)}
        base = max(want) + 10_000_000  # ids no user has
        asked = [base + i for i in range(DEVICES_CHUNK * 2 + 5)]
        # the real users spread over the chunks (first, at a chunk's edges, last)
        for pos, u in zip(
            (0, DEVICES_CHUNK - 1, DEVICES_CHUNK, DEVICES_CHUNK * 2, -1, 7), users, strict=True
        ):
            asked[pos] = uid(u)
        asked.append(uid(users[0]))  # a repeat

        async def all_listed() -> bool:
            got = await store.connected_devices(asked)
            return {u: got[u] for u in want} == want

        await eventually(all_listed, timeout=TIMEOUT)
        got = await store.connected_devices(asked)
        assert set(got) == set(asked) and len(got) == DEVICES_CHUNK * 2 + 5
        assert all(got[u] == set() for u in asked if u not in want)
        assert await store.connected_devices([]) == {}
    finally:
        for u in [*users, *devices]:
            await u.aclose()
