"""Presence (PROTOCOL.md "Presence"): online while a WebSocket is open on any process,
announced to friends only, offlines coalesced over a grace period, a killed process's
users offline within the node TTL. The servers here run with short timings so the rules
show in seconds."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from im_server.client import ApiError, Client, Connection
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    linked_servers,
    new_user,
)

GRACE_S = 1.0
NODE_TTL_S = 2.0
FAST = {
    "IM_PRESENCE_BEAT_SECONDS": "0.2",
    "IM_PRESENCE_NODE_TTL_SECONDS": str(NODE_TTL_S),
    "IM_PRESENCE_SWEEP_SECONDS": "0.2",
    "IM_PRESENCE_OFFLINE_GRACE_SECONDS": str(GRACE_S),
}
# an announcement is due within the grace plus a sweep tick; this leaves room for a busy CI
PUSH_TIMEOUT = 8.0


@pytest.fixture(scope="module")
def nodes(
    stores: Stores, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    logs = tmp_path_factory.mktemp("plogs")
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(logs)}
    with linked_servers(env, "pnode-1", "pnode-2") as pair:
        yield pair


def about(user: Client, online: bool | None = None) -> Any:
    def match(f: dict[str, Any]) -> bool:
        return f.get("user_id") == user.user_id and (online is None or f["online"] is online)

    return match


async def state(viewer: Client, user: Client) -> dict[str, Any]:
    (entry,) = await viewer.presence([int(user.user_id or 0)])
    return entry


async def is_online(viewer: Client, user: Client) -> bool:
    return (await state(viewer, user))["online"] is True


async def is_offline(viewer: Client, user: Client) -> bool:
    return (await state(viewer, user))["online"] is False


async def test_online_offline_across_processes(
    nodes: tuple[ServerProcess, ServerProcess],
) -> None:
    s1, s2 = nodes
    a = await new_user(s1.url, "pa")
    b = await new_user(s2.url, "pb")
    a2 = await Client.login(s2.url, str(a.username), PASSWORD, device_id="a-other")
    try:
        await befriend(a, b)
        assert await state(b, a) == {"user_id": a.user_id, "online": False, "last_seen": None}
        cb = await b.connect()  # server 2 watches
        ca = await a.connect()  # server 1
        f = await cb.next_event("presence", PUSH_TIMEOUT, about(a))
        assert f == {"type": "presence", "user_id": a.user_id, "online": True, "last_seen": None}
        assert await state(b, a) == {"user_id": a.user_id, "online": True, "last_seen": None}
        # and the other way: A (on server 1) sees B, who connected on server 2 first
        assert await state(a, b) == {"user_id": b.user_id, "online": True, "last_seen": None}

        ca2 = await a2.connect()  # a second device, on server 2: still one "online"
        await ca.close()  # A keeps a connection on server 2: still online
        assert await cb.try_next_event("presence", GRACE_S + 1.5, about(a)) is None
        assert await is_online(b, a)

        await ca2.close()  # the last one
        f = await cb.next_event("presence", PUSH_TIMEOUT, about(a))
        assert f["online"] is False and isinstance(f["last_seen"], int), f
        assert await state(b, a) == {
            "user_id": a.user_id,
            "online": False,
            "last_seen": f["last_seen"],
        }
        assert await cb.try_next_event("presence", 0.5, about(a)) is None  # announced once
    finally:
        for c in (a, b, a2):
            await c.aclose()


async def test_quick_reconnect_is_not_announced(
    nodes: tuple[ServerProcess, ServerProcess],
) -> None:
    s1, s2 = nodes
    a = await new_user(s1.url, "fa")
    b = await new_user(s1.url, "fb")
    try:
        await befriend(a, b)
        cb = await b.connect()
        ca = await a.connect()
        await cb.next_event("presence", PUSH_TIMEOUT, about(a, True))
        # gone and back within the grace (on the other process): no offline, no online
        await ca.close()
        again = await Client.login(s2.url, str(a.username), PASSWORD, device_id="again")
        back = await again.connect()
        assert await cb.try_next_event("presence", GRACE_S + 2.0, about(a)) is None
        assert await is_online(b, a)
        await back.close()
        f = await cb.next_event("presence", PUSH_TIMEOUT, about(a))
        assert f["online"] is False
        await again.aclose()
    finally:
        for c in (a, b):
            await c.aclose()


async def test_friends_only(nodes: tuple[ServerProcess, ServerProcess]) -> None:
    s1, _ = nodes
    names = ["a", "friend", "stranger", "removed", "remover", "blocked", "blocker"]
    clients = await asyncio.gather(*(new_user(s1.url, n) for n in names))
    users = dict(zip(names, clients, strict=True))
    a = users["a"]
    aid = int(a.user_id or 0)
    try:
        for n in ("friend", "removed", "remover", "blocked", "blocker"):
            await befriend(a, users[n])
        await a.remove_friend(int(users["removed"].user_id or 0))  # I removed them
        await users["remover"].remove_friend(aid)  # they removed me
        await a.block(int(users["blocked"].user_id or 0))  # I blocked them
        await users["blocker"].block(aid)  # they blocked me
        conns: dict[str, Connection] = {}
        for n in names[1:]:
            conns[n] = await users[n].connect()
        await a.connect()
        await conns["friend"].next_event("presence", PUSH_TIMEOUT, about(a, True))
        hidden = {"user_id": aid, "online": None, "last_seen": None}
        assert await state(users["friend"], a) == {
            "user_id": aid,
            "online": True,
            "last_seen": None,
        }
        for n in names[2:]:
            assert await state(users[n], a) == hidden, n
            # and the other way round: A does not see them either
            other = users[n]
            assert (await state(a, other))["online"] is None, n
        for n in names[2:]:
            assert await conns[n].try_next_event("presence", 0.3) is None, n
        # my own presence is mine to see
        assert await state(a, a) == {"user_id": aid, "online": True, "last_seen": None}
    finally:
        for c in users.values():
            await c.aclose()


async def test_killed_process_users_go_offline(
    nodes: tuple[ServerProcess, ServerProcess], stores: Stores, tmp_path: Any
) -> None:
    s1, _ = nodes
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(tmp_path)}
    s3 = ServerProcess(env={**env, "IM_NODE_NAME": "pnode-doomed"}).start()
    a = await new_user(s1.url, "ka")
    b = await new_user(s1.url, "kb")
    a3 = await Client.login(s3.url, str(a.username), PASSWORD, device_id="doomed")
    try:
        await befriend(a, b)
        cb = await b.connect()
        await a3.connect()
        await cb.next_event("presence", PUSH_TIMEOUT, about(a, True))
        assert await is_online(b, a)
        s3.kill9()
        killed = asyncio.get_running_loop().time()
        # the node TTL, a sweep tick: well within the contract's 60 s
        f = await cb.next_event("presence", NODE_TTL_S + PUSH_TIMEOUT, about(a))
        took = asyncio.get_running_loop().time() - killed
        assert f["online"] is False and isinstance(f["last_seen"], int), f
        assert took < NODE_TTL_S + PUSH_TIMEOUT, took
        assert await state(b, a) == {
            "user_id": a.user_id,
            "online": False,
            "last_seen": f["last_seen"],
        }
    finally:
        s3.kill9()
        for c in (a, b):
            await c.aclose()
        await a3.aclose()


async def test_restart_under_same_name_clears_old_entries(
    stores: Stores, tmp_path: Any, nodes: tuple[ServerProcess, ServerProcess]
) -> None:
    """A process killed and started again under the same node name must not keep its
    earlier users online (they are taken offline at start)."""
    s1, _ = nodes
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(tmp_path)}
    env["IM_PRESENCE_NODE_TTL_SECONDS"] = "600"  # only the restart can clear them
    s3 = ServerProcess(env={**env, "IM_NODE_NAME": "pnode-phoenix"}).start()
    a = await new_user(s1.url, "ra")
    b = await new_user(s1.url, "rb")
    a3 = await Client.login(s3.url, str(a.username), PASSWORD, device_id="phoenix")
    try:
        await befriend(a, b)
        await a3.connect()
        await eventually(lambda: is_online(b, a), timeout=PUSH_TIMEOUT)
        s3.kill9()
        s3 = ServerProcess(env={**env, "IM_NODE_NAME": "pnode-phoenix"}).start()
        await eventually(lambda: is_offline(b, a), timeout=PUSH_TIMEOUT)
        assert isinstance((await state(b, a))["last_seen"], int)
    finally:
        s3.terminate()
        for c in (a, b, a3):
            await c.aclose()


@pytest.mark.parametrize(
    "query",
    [
        "",
        "abc",
        "0",
        "-1",
        "1,,2",
        "1,",
        " 1",
        "1.5",
        str(2**63),
        "9" * 21,
        ",".join(str(i) for i in range(1, 202)),
        "１",  # a full-width digit
    ],
)
async def test_bad_user_ids(url: str, alice: Client, query: str) -> None:
    with pytest.raises(ApiError) as e:
        await alice.request("GET", "/v1/presence", params={"user_ids": query})
    assert e.value.status in (400, 422) and e.value.code == "bad_request", e.value


async def test_bounds_and_repeats(url: str, alice: Client, bob: Client) -> None:
    with pytest.raises(ApiError) as e:
        await alice.request("GET", "/v1/presence")
    assert e.value.code == "bad_request"
    ids = list(range(1, 201))
    got = await alice.presence(ids)
    assert [x["user_id"] for x in got] == ids
    bid, aid = int(bob.user_id or 0), int(alice.user_id or 0)
    got = await alice.presence([bid, aid, bid])
    assert [x["user_id"] for x in got] == [bid, aid]
    assert got[0] == {"user_id": bid, "online": None, "last_seen": None}
    assert got[1]["online"] is False  # myself, no socket open


async def test_stalled_process_comes_back_online(
    nodes: tuple[ServerProcess, ServerProcess], stores: Stores, tmp_path: Any
) -> None:
    """A process that stalls past the node TTL is taken for dead (its users go offline);
    when it runs again, its users are recorded and announced online again."""
    s1, _ = nodes
    env = {**stores.env(), **FAST, "IM_TEST_LOG_DIR": str(tmp_path)}
    s3 = ServerProcess(env={**env, "IM_NODE_NAME": "pnode-stalled"}).start()
    a = await new_user(s1.url, "sa")
    b = await new_user(s1.url, "sb")
    a3 = await Client.login(s3.url, str(a.username), PASSWORD, device_id="stalled")
    assert s3.proc is not None
    try:
        await befriend(a, b)
        cb = await b.connect()
        await a3.connect()
        await cb.next_event("presence", PUSH_TIMEOUT, about(a, True))
        os.killpg(s3.proc.pid, signal.SIGSTOP)
        try:
            f = await cb.next_event("presence", NODE_TTL_S + PUSH_TIMEOUT, about(a))
            assert f["online"] is False, f
        finally:
            os.killpg(s3.proc.pid, signal.SIGCONT)
        f = await cb.next_event("presence", PUSH_TIMEOUT, about(a))
        assert f["online"] is True, f
        await eventually(lambda: is_online(b, a), timeout=PUSH_TIMEOUT)
    finally:
        s3.kill9()
        for c in (a, b, a3):
            await c.aclose()


async def test_a_dead_process_users_were_last_seen_at_its_last_beat(tmp_path: Any) -> None:
    """Between a process's death and the sweep that takes its users over, and after it,
    its users read offline and last seen when the process was last known alive (its last
    beat), never "never seen" (null is for online or never seen). On a Valkey of its own:
    no other process sweeps it."""
    from im_server.runtime.embedded import start_redis
    from im_server.storage.redis import keys
    from im_server.storage.redis.store import RedisStore

    ttl_ms = 300
    server = start_redis(tmp_path / "valkey")
    store = RedisStore(server.url, dedupe_ttl=60)
    try:
        user, never = 4242, 4343
        await store.presence_beat("doomed", ttl_ms)
        await store.presence_set("doomed", [(user, ["phone"])], 1000, 86_400_000)
        beat = int(await store.client.zscore(keys.PRESENCE_NODES, "doomed")) - ttl_ms
        assert await store.presence([user, never], ttl_ms) == [(True, None), (False, None)]
        await asyncio.sleep(ttl_ms / 1000 + 0.1)  # under test: the node's entry expires
        # dead, not swept yet
        assert await store.presence([user, never], ttl_ms) == [(False, beat), (False, None)]
        # swept: the offline is announced with the same time, and read the same
        assert await store.presence_sweep(86_400_000, 100, ttl_ms) == [(user, beat)]
        assert await store.presence([user], ttl_ms) == [(False, beat)]
    finally:
        await store.close()
        server.stop()
