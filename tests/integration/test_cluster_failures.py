"""One shard's failure stays on that shard (the contract's Operations section), on an
embedded Valkey Cluster of 3 primaries and 3 replicas with no setting but
``IM_REDIS_CLUSTER=true``:

- while a primary is killed (kill -9) and stays dead, senders on conversations of the
  other shards keep being acked, with no ``unavailable`` and no added second;
- the failed shard's conversations are acked again within 15 s of its replica's
  promotion, with the killed node still dead (the promoted primary has no replica: the
  acks wait for its own AOF instead, ``IM_REDIS_ACK_DURABILITY``);
- every acked send is stored once under its acked seq.

The module has a cluster of its own: it leaves a node dead."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from im_server.bench.chaos.processes import PersisterProcess
from im_server.client import Client, Connection
from im_server.runtime.cluster_admin import slot_of
from im_server.runtime.embedded import EmbeddedRuntimeError
from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
from im_server.services.partitions import CLUSTER_DEFAULT
from im_server.storage.redis import keys
from tests.support import ServerProcess, Stores, befriend, eventually, new_user, pg

CONVS_PER_SHARD = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster-failures") / "valkey")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def env(
    stores: Stores, cluster: EmbeddedCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    return {
        **stores.env(),
        "IM_REDIS_URL": cluster.url,
        "IM_REDIS_CLUSTER": "true",
        "IM_REDIS_MAP_REFRESH_SECONDS": "1",
        "IM_TEST_LOG_DIR": str(tmp_path_factory.mktemp("cf-logs")),
    }


@pytest.fixture(scope="module")
def persister(env: dict[str, str]) -> Iterator[PersisterProcess]:
    """The persister apart from the server, so a test can hold it (what is acked then
    lives in Redis alone)."""
    p = PersisterProcess(env, "cf-persister", Path(env["IM_TEST_LOG_DIR"])).start()
    yield p
    p.terminate()


@pytest.fixture(scope="module")
def on_cluster(env: dict[str, str], persister: PersisterProcess) -> Iterator[ServerProcess]:
    srv = ServerProcess(env=env, extra_args=["--no-persister"]).start()
    yield srv
    srv.terminate()


class Sender:
    """One user sending to one conversation, one send at a time, on a socket of its own;
    an ``unavailable`` answer is retried with the same client_msg_id after 0.1 s."""

    def __init__(self, conn: Connection, conv: str, tag: str) -> None:
        self.conn, self.conv, self.tag = conn, conv, tag
        self.acked: dict[str, int] = {}
        self.latencies: list[tuple[float, float]] = []  # (sent at, seconds to the ack)
        self.refusals: list[float] = []  # when an `unavailable` came
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            cmid = f"{self.tag}-{n}"
            while True:
                t0 = time.monotonic()
                ack = await self.conn.send(self.conv, cmid, client_msg_id=cmid, timeout=30)
                if ack["ok"]:
                    self.acked[cmid] = int(ack["seq"])
                    self.latencies.append((t0, time.monotonic() - t0))
                    break
                assert ack["code"] == "unavailable", ack
                self.refusals.append(time.monotonic())
                await asyncio.sleep(0.1)  # a client's retry pace
            n += 1
            await asyncio.sleep(0.02)

    def acked_after(self, t: float) -> float | None:
        """When the first send made after ``t`` was acked."""
        for sent, took in self.latencies:
            if sent > t:
                return sent + took
        return None


def _primary_of(cluster: EmbeddedCluster, conv: str) -> int:
    return cluster.slot_owner(slot_of(keys.stream(keys.partition_of(conv, CLUSTER_DEFAULT))))


async def _conversations(url: str, cluster: EmbeddedCluster) -> dict[int, list[tuple[Client, str]]]:
    """``CONVS_PER_SHARD`` single chats on each primary: port -> [(sender, conv)]."""
    by_shard: dict[int, list[tuple[Client, str]]] = {p.port: [] for p in cluster.primaries()}
    while any(len(v) < CONVS_PER_SHARD for v in by_shard.values()):
        a, b = await new_user(url, "cfa"), await new_user(url, "cfb")
        conv = await befriend(a, b)
        port = _primary_of(cluster, conv)
        if len(by_shard[port]) < CONVS_PER_SHARD:
            by_shard[port].append((a, conv))
    return by_shard


async def test_a_dead_primary_stops_only_its_own_shard(
    cluster: EmbeddedCluster, on_cluster: ServerProcess, stores: Stores
) -> None:
    by_shard = await _conversations(on_cluster.url, cluster)
    victim = next(iter(by_shard))
    senders: dict[int, list[Sender]] = {}
    for port, pairs in by_shard.items():
        senders[port] = [
            Sender(await c.connect(), conv, f"s{port}-{i}") for i, (c, conv) in enumerate(pairs)
        ]
    everyone = [s for group in senders.values() for s in group]
    tasks = [asyncio.create_task(s.run()) for s in everyone]
    await eventually(lambda: all(len(s.acked) >= 5 for s in everyone), timeout=30)

    killed_at = time.monotonic()
    cluster.kill_node(victim)

    def promoted() -> bool:
        try:
            return all(_primary_of(cluster, s.conv) != victim for s in senders[victim])
        except EmbeddedRuntimeError:
            return False

    await eventually(promoted, timeout=60, interval=0.2)
    promoted_at = time.monotonic()
    # the failed shard takes sends again within 15 s of the promotion, the killed node
    # still dead; the others kept going all along
    await eventually(lambda: all(s.acked_after(promoted_at) for s in senders[victim]), timeout=15)
    back = max(s.acked_after(promoted_at) or 0.0 for s in senders[victim]) - promoted_at
    await asyncio.sleep(2)  # a little more traffic after the recovery
    for s in everyone:
        s.stop.set()
    await asyncio.gather(*tasks)
    assert cluster.node(victim).pid() is None  # never restarted

    healthy = [s for port, group in senders.items() if port != victim for s in group]
    refused = [(s.conv, len(s.refusals)) for s in healthy if s.refusals]
    assert not refused, f"sends to healthy shards answered unavailable: {refused}"
    before = [took for s in healthy for sent, took in s.latencies if sent < killed_at]
    during = [
        took for s in healthy for sent, took in s.latencies if killed_at <= sent < promoted_at
    ]
    p99 = lambda xs: statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else max(xs)  # noqa: E731
    assert during, "the healthy shards sent nothing while the primary was down"
    # "no added second": the ack p99 of the healthy shards during the outage stays
    # within a few tens of milliseconds of what it was before
    assert p99(during) < max(0.25, 3 * p99(before)), (p99(before), p99(during))
    print(
        f"\n[dead primary] promoted {promoted_at - killed_at:.1f} s after the kill; its "
        f"shard acked again {back:.2f} s after the promotion; healthy shards: "
        f"{len(during)} acks during the outage, p99 {p99(during) * 1000:.0f} ms "
        f"(before: {p99(before) * 1000:.0f} ms), none refused"
    )

    # every acked send stored once, under its acked seq
    acked = {cmid: (s.conv, seq) for s in everyone for cmid, seq in s.acked.items()}
    convs = [s.conv for s in everyone]

    async def stored() -> dict[str, tuple[str, int]] | None:
        async with pg(stores) as db:
            rows = await db.fetch(
                "SELECT conv_id, seq, client_msg_id FROM messages WHERE conv_id = ANY($1)",
                convs,
            )
        got = {r["client_msg_id"]: (r["conv_id"], int(r["seq"])) for r in rows}
        assert len(got) == len(rows), "a client_msg_id stored twice"
        return got if len(got) >= len(acked) else None

    assert await eventually(stored, timeout=30) == acked


async def test_an_ack_without_a_replica_survives_its_primary_crash(
    cluster: EmbeddedCluster,
    on_cluster: ServerProcess,
    persister: PersisterProcess,
    env: dict[str, str],
    stores: Stores,
) -> None:
    """Where the previous test left it: a shard whose primary (the promoted replica) has
    no replica, the lost node still dead. Its acks wait for the primary's AOF fsync
    (``aof``, the default): with the persister held, so the acked sends live in Redis
    alone, kill -9 of that primary too (both nodes of the shard down) loses none of
    them: restarted on its folder it has them, and the persister stores every one under
    its acked seq. With ``refuse`` the same shard answers ``unavailable`` instead."""
    dead = [n.port for n in cluster.nodes if n.pid() is None]
    assert len(dead) == 1, "the previous test leaves one node dead"
    lonely = _lonely_primary(cluster)
    a, b = await new_user(on_cluster.url, "aa"), await new_user(on_cluster.url, "ab")
    while True:
        conv = await befriend(a, b)
        if _primary_of(cluster, conv) == lonely:
            break
        a, b = await new_user(on_cluster.url, "aa"), await new_user(on_cluster.url, "ab")

    # a process started now names a live node (the module's first URL may be the dead one)
    live_env = {**env, "IM_REDIS_URL": cluster.url}
    strict = ServerProcess(
        env={**live_env, "IM_REDIS_ACK_WITHOUT_REPLICA": "refuse", "IM_NODE_NAME": "cf-strict"},
        extra_args=["--no-persister"],
    ).start()
    try:
        on_strict = await Client.login(strict.url, str(a.username), "password-1234")
        async with on_strict:
            conn = await on_strict.connect()
            ack = await conn.send(conv, "strict", client_msg_id="strict-1")
            assert ack["ok"] is False and ack["code"] == "unavailable", ack
            await conn.close()
    finally:
        strict.terminate()

    persister.terminate()  # what is acked from now on lives in Redis alone
    conn = await a.connect()
    acked = {}
    for i in range(20):
        ack = await conn.send(conv, f"m{i}", client_msg_id=f"aof-{i}")
        assert ack["ok"] is True, ack
        acked[f"aof-{i}"] = (conv, int(ack["seq"]))
    await conn.close()
    cluster.kill_node(lonely)  # both nodes of the shard are down now
    await asyncio.to_thread(cluster.restart_node, lonely)
    persister.env["IM_REDIS_URL"] = cluster.url
    persister.start()

    async def stored() -> dict[str, tuple[str, int]] | None:
        async with pg(stores) as db:
            rows = await db.fetch(
                "SELECT client_msg_id, seq FROM messages WHERE conv_id = $1", conv
            )
        got = {r["client_msg_id"]: (conv, int(r["seq"])) for r in rows}
        return got if len(got) >= len(acked) else None

    assert await eventually(stored, timeout=60) == acked


def _lonely_primary(cluster: EmbeddedCluster) -> int:
    """The port of the primary that the slot map shows without a replica."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        lonely = {
            int(nodes[0].port) for nodes in rc.nodes_manager.slots_cache.values() if len(nodes) == 1
        }
    finally:
        rc.close()
    assert len(lonely) == 1, lonely
    return lonely.pop()
