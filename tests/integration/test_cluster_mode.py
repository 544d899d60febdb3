"""The server on a Valkey Cluster (3 primaries, 3 replicas, started from the wheel):
`IM_REDIS_CLUSTER=true` and no partition setting (a new keyspace spreads over every
shard: 64 stream partitions), the stricter ack rule (``IM_REDIS_ACK_WITHOUT_REPLICA=
refuse``), two gateway processes and a persister of its own. Sends to conversations of every shard are acked with dense seqs, reach the
other process's devices, are deduplicated and stored once; logins (script calls on
counters of different slots) and presence work; no call crosses slots."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from im_server.bench.chaos.processes import PersisterProcess
from im_server.client import ApiError, Client, Connection, Device
from im_server.runtime.cluster_admin import slot_of
from im_server.runtime.embedded import EmbeddedRuntimeError
from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
from im_server.services.partitions import CLUSTER_DEFAULT
from im_server.storage.redis import keys
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    linked_servers,
    new_user,
    pg,
)

PARTITIONS = CLUSTER_DEFAULT  # what a new keyspace in cluster mode records by itself
MAP_REFRESH_S = 1.0
SLOTS_TO_TRY = 16384


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster-mode") / "valkey")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def on_cluster(
    stores: Stores, cluster: EmbeddedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two gateways (``--no-persister``) and a persister of its own, on the cluster."""
    logs = tmp_path_factory.mktemp("cluster-logs")
    env = {
        **stores.env(),
        "IM_REDIS_URL": cluster.url,
        "IM_REDIS_CLUSTER": "true",
        # the stricter ack rule: no ack until a replica holds the send (the default, acks
        # on the primary's own AOF when it has no live replica, is test_cluster_failures')
        "IM_REDIS_ACK_WITHOUT_REPLICA": "refuse",
        "IM_REDIS_MAP_REFRESH_SECONDS": str(MAP_REFRESH_S),
        "IM_TEST_LOG_DIR": str(logs),
    }
    persister = PersisterProcess(env, "cl-persister", logs).start()
    try:
        with linked_servers(env, "cl-1", "cl-2", extra_args=["--no-persister"]) as pair:
            yield pair
    finally:
        persister.terminate()


def _owners(cluster: EmbeddedCluster) -> dict[int, int]:
    """Partition -> the port of the primary serving its tag's slot."""
    rc = RedisCluster.from_url(cluster.url)
    try:
        out = {}
        for p in range(PARTITIONS):
            node = rc.nodes_manager.get_node_from_slot(slot_of(keys.stream(p)))
            out[p] = int(node.port)
        return out
    finally:
        rc.close()


async def test_sends_across_shards_two_gateways(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    s1, s2 = on_cluster
    owners = _owners(cluster)
    # no setting: the keyspace recorded the cluster default, and its partitions span
    # every primary
    rc = RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        assert rc.get(keys.PARTITIONS) == str(PARTITIONS)
    finally:
        rc.close()
    assert set(owners.values()) == {p.port for p in cluster.primaries()}, owners

    a = await new_user(s1.url, "ca")
    friends = [await new_user(s1.url, "cf") for _ in range(10)]
    convs = [await befriend(a, f) for f in friends]
    shards = {owners[keys.partition_of(c, PARTITIONS)] for c in convs}
    assert len(shards) >= 2, "the conversations should land on more than one shard"

    # every friend listens on the other process
    listeners = []
    for f in friends:
        on2 = await type(f).login(s2.url, str(f.username), PASSWORD, device_id="d2")
        listeners.append((on2, await on2.connect()))
    conn = await a.connect()
    acks = await asyncio.gather(
        *(
            conn.send(c, f"m{i}", client_msg_id=f"cl-{n}-{i}")
            for n, c in enumerate(convs)
            for i in range(5)
        )
    )
    assert all(x["ok"] and not x["duplicate"] for x in acks), acks
    for c in convs:
        seqs = sorted(int(x["seq"]) for x in acks if x["conv_id"] == c)
        assert seqs == [1, 2, 3, 4, 5], (c, seqs)
    again = await conn.send(convs[0], "m0", client_msg_id="cl-0-0")
    first = next(x for x in acks if x["client_msg_id"] == "cl-0-0")
    assert again["duplicate"] is True and again["seq"] == first["seq"]

    for n, (_client, lc) in enumerate(listeners):
        got = await lc.next_event(
            "message", 10.0, lambda f, n=n: f["message"]["client_msg_id"] == f"cl-{n}-4"
        )
        assert got["message"]["conv_id"] == convs[n]

    async def stored() -> list[int]:
        async with pg(stores) as db:
            rows = await db.fetch(
                "SELECT conv_id, count(*) AS n FROM messages WHERE conv_id = ANY($1) "
                "GROUP BY conv_id",
                convs,
            )
        return sorted(int(r["n"]) for r in rows)

    deadline = asyncio.get_running_loop().time() + 20
    while await stored() != [5] * len(convs):
        assert asyncio.get_running_loop().time() < deadline, await stored()
        await asyncio.sleep(0.1)

    for c in convs:
        history = await a.history(c, 1, 5)
        assert [m["seq"] for m in history["messages"]] == [1, 2, 3, 4, 5]
    # presence (one {pr} slot): the friends are online on the other process
    seen = await a.presence([int(f.user_id or 0) for f in friends])
    assert [p["online"] for p in seen] == [True] * len(friends), seen
    await conn.close()
    for client, lc in listeners:
        await lc.close()
        await client.aclose()
    await a.aclose()
    for f in friends:
        await f.aclose()


async def test_groups_reads_and_sync_on_the_cluster(
    on_cluster: tuple[ServerProcess, ServerProcess],
) -> None:
    """The core paths across the two gateways: a group's messages reach a member live on
    the other gateway; read cursors only move forward and unread counts follow; receipts
    name the reader; a device that was offline catches up through sync and history on
    the other gateway with every message once; a long poll there wakes on a send; a
    session revoked on one gateway loses its socket on the other."""
    s1, s2 = on_cluster
    a = await new_user(s1.url, "ga")
    b = await new_user(s1.url, "gb")
    c = await new_user(s1.url, "gc")
    b2 = await Client.login(s2.url, str(b.username), PASSWORD, device_id="b-on-2")
    c2 = await Client.login(s2.url, str(c.username), PASSWORD, device_id="c-on-2")
    try:
        conv = (await a.create_group("on the cluster", [int(b.user_id or 0), int(c.user_id or 0)]))[
            "conv_id"
        ]
        ca, cb = await a.connect(), await b2.connect()
        acks = [await ca.send(conv, f"g{i}", client_msg_id=f"grp-{i}") for i in range(20)]
        assert [x["seq"] for x in acks] == list(range(1, 21)), acks
        got = await cb.next_event(
            "message", 10.0, lambda f: f["message"]["client_msg_id"] == "grp-19"
        )
        assert got["message"]["seq"] == 20

        await eventually(lambda: _unread(b2, conv, 20), timeout=20)  # persisted
        await cb.read(conv, 10)
        await eventually(lambda: _unread(b2, conv, 10))
        await cb.read(conv, 5)  # a cursor never moves back
        await asyncio.sleep(0.3)
        assert await _unread(b2, conv, 10)
        receipts = await a.receipts(conv, 10)
        assert int(b.user_id or 0) in receipts["readers"], receipts

        device = Device(c2)
        await device.start()
        assert sorted(device.messages[conv]) == list(range(1, 21))
        version = (await c2.sync(0))["version"]
        poll = asyncio.create_task(c2.sync(version, wait=10))
        await asyncio.sleep(0.5)
        assert not poll.done()
        started = asyncio.get_running_loop().time()
        await ca.send(conv, "wake", client_msg_id="grp-wake")
        answer = await poll
        assert asyncio.get_running_loop().time() - started < 5
        assert conv in [s["conv_id"] for s in answer["conversations"]], answer
        await device.aclose()
        # the control channel (classic pub/sub on a Cluster): a session revoked through
        # the first gateway closes its socket on the second at once
        await b.revoke_session("b-on-2")
        assert await cb.wait_closed(timeout=3.0) == 4401
        await ca.close()
    finally:
        for cl in (a, b, c, b2, c2):
            await cl.aclose()


async def _unread(client: Client, conv: str, n: int) -> bool:
    items = (await client.unread())["conversations"]
    return [i["unread"] for i in items if i["conv_id"] == conv] == [n]


async def test_a_failed_login_is_counted_on_the_cluster(
    on_cluster: tuple[ServerProcess, ServerProcess],
) -> None:
    s1, _ = on_cluster
    a = await new_user(s1.url, "cl")
    with pytest.raises(ApiError):
        await Client.login(s1.url, str(a.username), "not-" + PASSWORD)
    again = await Client.login(s1.url, str(a.username), PASSWORD)
    assert again.user_id == a.user_id
    await again.aclose()
    await a.aclose()


def _replica_ports(cluster: EmbeddedCluster, primary: int) -> list[int]:
    r = redis.Redis(host="127.0.0.1", port=primary, password=cluster.password)
    try:
        info = r.info("replication")
    finally:
        r.close()
    return [int(v["port"]) for k, v in info.items() if k.startswith("slave")]


async def test_an_ack_waits_for_a_replica(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess]
) -> None:
    """With the replica of a partition's primary frozen, a send there is not acked: it is
    answered `unavailable` after the wait (IM_REDIS_WAIT_TIMEOUT_MS); its retry, once
    the replica is back, gets the first send's seq as a duplicate."""
    s1, _ = on_cluster
    a, b = await new_user(s1.url, "wa"), await new_user(s1.url, "wb")
    conv = await befriend(a, b)
    primary = cluster.slot_owner(slot_of(keys.stream(keys.partition_of(conv, PARTITIONS))))
    replicas = _replica_ports(cluster, primary)
    assert replicas, "the primary should have a replica"
    conn = await a.connect()
    assert (await conn.send(conv, "before"))["ok"]
    pids = [cluster.node(port).pid() for port in replicas]
    for pid in pids:
        os.kill(pid or 0, signal.SIGSTOP)
    try:
        refused = await conn.send(conv, "while the replica sleeps", client_msg_id="w-1")
    finally:
        for pid in pids:
            os.kill(pid or 0, signal.SIGCONT)
    assert refused["ok"] is False and refused["code"] == "unavailable", refused
    again = await eventually(lambda: _acked(conn, conv, "w-1"), timeout=30)
    assert again["duplicate"] is True, (refused, again)
    await conn.close()
    await a.aclose()
    await b.aclose()


async def _acked(conn: Connection, conv: str, cmid: str) -> dict[str, Any] | None:
    ack = await conn.send(conv, "while the replica sleeps", client_msg_id=cmid)
    return ack if ack["ok"] else None


class Load:
    """One sender's sends to every conversation, round after round; an `unavailable`
    answer is retried with the same client_msg_id, as a client does. Records each ack and
    when the sends to ``watched`` were first acked again after ``mark()``."""

    def __init__(self, conn: Connection, convs: list[str], tag: str) -> None:
        self.conn, self.convs, self.tag = conn, convs, tag
        self.acked: dict[str, tuple[str, int]] = {}  # client_msg_id -> (conv, seq)
        self.refused = 0
        self.marked = 0.0
        self.back_after: float | None = None
        self.loop = asyncio.get_running_loop()

    def mark(self) -> None:
        self.marked = self.loop.time()

    async def _send(self, conv: str, cmid: str) -> None:
        deadline = self.loop.time() + 40
        while True:
            started = self.loop.time()
            ack = await self.conn.send(conv, cmid, client_msg_id=cmid)
            if ack["ok"]:
                self.acked[cmid] = (conv, int(ack["seq"]))
                after = self.marked and started > self.marked
                if conv == self.convs[0] and after and self.back_after is None:
                    self.back_after = self.loop.time() - self.marked
                return
            assert ack["code"] == "unavailable", ack
            self.refused += 1
            assert self.loop.time() < deadline, f"{cmid} not acked within 40 s"
            await asyncio.sleep(0.2)  # a client's retry pace, not a sync point

    async def run(self, rounds: int) -> None:
        for r in range(rounds):
            await asyncio.gather(
                *(self._send(c, f"{self.tag}{n}-{r}") for n, c in enumerate(self.convs))
            )


async def assert_stored_once(stores: Stores, convs: list[str], acked: dict[str, Any]) -> None:
    """Every acked send stored exactly once, under its acked seq (so no seq served two)."""
    loop = asyncio.get_running_loop()
    async with pg(stores) as db:
        deadline = loop.time() + 30
        while True:
            rows = await db.fetch(
                "SELECT conv_id, seq, client_msg_id FROM messages WHERE conv_id = ANY($1)",
                convs,
            )
            if len(rows) >= len(acked) or loop.time() > deadline:
                break
            await asyncio.sleep(0.2)
    stored = {r["client_msg_id"]: (r["conv_id"], int(r["seq"])) for r in rows}
    assert len(rows) == len(stored), "a client_msg_id stored twice"
    assert stored == acked, {k: (acked.get(k), stored.get(k)) for k in set(acked) ^ set(stored)}


async def test_kill9_of_a_primary_loses_no_acked_send(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    """Sends run on every shard while the primary of one conversation's partition is
    killed: an ack says the sends reached a replica (WAIT), so after the replica takes
    over every acked send is stored exactly once under its acked seq, no seq serves two
    messages, and sends to that partition are acked again within 15 s (a client retries
    an `unavailable` send with the same client_msg_id). The promoted replica has no
    replica of its own until the killed node is back (restarted as a supervisor would,
    once the fail-over is done): with the module's ``refuse`` rule its sends are refused
    until then, not acked without a replica."""
    s1, _s2 = on_cluster
    a = await new_user(s1.url, "ka")
    friends = [await new_user(s1.url, "kf") for _ in range(6)]
    convs = [await befriend(a, f) for f in friends]
    victim_slot = slot_of(keys.stream(keys.partition_of(convs[0], PARTITIONS)))
    victim_port = cluster.slot_owner(victim_slot)
    conn = await a.connect()
    load = Load(conn, convs, "k")

    def owner() -> int | None:
        try:
            return cluster.slot_owner(victim_slot)
        except EmbeddedRuntimeError:  # failed, no replica promoted yet
            return None

    def restart_after_fail_over() -> None:
        deadline = time.monotonic() + 30
        while owner() in (victim_port, None):
            assert time.monotonic() < deadline, "no fail-over within 30 s"
            time.sleep(0.1)  # polling the cluster's own view
        cluster.restart_node(victim_port)  # back, as the new primary's replica

    task = asyncio.create_task(load.run(60))
    await eventually(lambda: len(load.acked) >= 3 * len(convs), timeout=30)  # every shard
    cluster.kill_node(victim_port)
    load.mark()
    try:
        await asyncio.to_thread(restart_after_fail_over)
        await asyncio.wait_for(task, 120)
    finally:
        if cluster.node(victim_port).pid() is None:
            await asyncio.to_thread(cluster.restart_node, victim_port)
    assert load.back_after is not None and load.back_after < 15, load.back_after
    print(
        f"\n[kill -9 of a primary] acked again after {load.back_after:.1f} s; "
        f"{load.refused} sends answered unavailable and retried"
    )
    assert len(load.acked) == 60 * len(convs)
    await assert_stored_once(stores, convs, load.acked)
    await conn.close()
    await a.aclose()
    for f in friends:
        await f.aclose()


async def test_a_slot_move_under_load_keeps_every_guarantee(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    """Resharding under load: the slot of one conversation's partition (its stream, seq
    counters, dedupe keys, boot marker) moves to another primary while sends run on every
    shard. Clients are sent on (ASK, then MOVED); a send the move catches half-way is
    answered `unavailable` and retried. Every acked send is stored exactly once under its
    acked seq, the moved partition's sends are acked again, and the slot ends on the
    target."""
    s1, _s2 = on_cluster
    a = await new_user(s1.url, "ma")
    friends = [await new_user(s1.url, "mf") for _ in range(6)]
    convs = [await befriend(a, f) for f in friends]
    slot = slot_of(keys.stream(keys.partition_of(convs[0], PARTITIONS)))
    source = cluster.slot_owner(slot)
    target = next(p.port for p in cluster.primaries() if p.port != source)
    conn = await a.connect()
    load = Load(conn, convs, "m")
    task = asyncio.create_task(load.run(40))
    await eventually(lambda: len(load.acked) >= 3 * len(convs), timeout=30)  # every shard
    moved = await asyncio.to_thread(cluster.migrate_slots, [slot], target)
    load.mark()
    await asyncio.wait_for(task, 120)
    assert moved >= 3, moved  # the stream, the boot marker, counters and dedupe keys
    assert cluster.slot_owner(slot) == target
    assert load.back_after is not None and load.back_after < 5, load.back_after
    print(
        f"\n[slot move] {moved} keys moved; {load.refused} sends answered unavailable and retried"
    )
    assert len(load.acked) == 40 * len(convs)
    await assert_stored_once(stores, convs, load.acked)
    await conn.close()
    await a.aclose()
    for f in friends:
        await f.aclose()


async def test_sends_around_a_slot_move_follow_the_slot(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess]
) -> None:
    """A send made while its partition's slot is migrating, every key already on the
    target, is acked or answered `unavailable` (the shards answer ASK, then TRYAGAIN for
    a script whose keys are not all there yet), never an error; its retry after the move
    is acked once. The first send after the move is acked at once: the server follows
    the old owner's MOVED to the new one (learning the map again) instead of refusing.
    Seqs stay increasing (the counter now lives on a node of another run, so a fresh
    block is reserved: a gap, never a reuse)."""
    s1, _s2 = on_cluster
    a = await new_user(s1.url, "aa")
    b = await new_user(s1.url, "ab")
    conv = await befriend(a, b)
    conn = await a.connect()
    first = [await conn.send(conv, f"before {i}", client_msg_id=f"mv-{i}") for i in range(3)]
    assert [x["seq"] for x in first] == [1, 2, 3], first
    slot = slot_of(keys.stream(keys.partition_of(conv, PARTITIONS)))
    source = cluster.slot_owner(slot)
    target = next(p.port for p in cluster.primaries() if p.port != source)
    total = cluster.keys_in_slot(slot)
    loop = asyncio.get_running_loop()
    during: list[dict[str, Any]] = []

    def progress(_slot: int, moved: int) -> None:
        if moved >= total and not during:  # all keys moved, the slot not yet handed over
            sent = asyncio.run_coroutine_threadsafe(
                conn.send(conv, "during", client_msg_id="mv-during"), loop
            )
            during.append(sent.result(15))

    await asyncio.to_thread(cluster.migrate_slots, [slot], target, progress)
    after = await conn.send(conv, "after", client_msg_id="mv-after")
    assert cluster.slot_owner(slot) == target
    assert after["ok"] is True and after["seq"] > 3, after
    assert len(during) == 1, during
    if not during[0]["ok"]:
        assert during[0]["code"] == "unavailable", during
        during[0] = await conn.send(conv, "during", client_msg_id="mv-during")
        assert during[0]["ok"] is True and not during[0]["duplicate"], during
    again = await conn.send(conv, "during", client_msg_id="mv-during")
    assert again["duplicate"] is True and again["seq"] == during[0]["seq"], again
    assert len({3, during[0]["seq"], after["seq"]}) == 3 and min(during[0]["seq"], after["seq"]) > 3
    await conn.close()
    await a.aclose()
    await b.aclose()


async def test_a_fourth_primary_takes_a_partition_under_load(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    """Resharding onto a node that was not there: a fourth primary (with a replica, so
    acks can wait for one) joins, is given an empty slot first (clients learn primaries
    from the slot map, which lists only primaries with slots; the servers refresh theirs
    every IM_REDIS_MAP_REFRESH_SECONDS), then one partition's slot moves to it under a
    load on every shard. Sends caught by the move follow ASK or are answered
    `unavailable` and retried; every acked send is stored exactly once under its acked
    seq, and the moved partition's sends are acked again, on the new primary."""
    s1, _s2 = on_cluster
    a = await new_user(s1.url, "fa")
    friends = [await new_user(s1.url, "ff") for _ in range(6)]
    convs = [await befriend(a, f) for f in friends]
    slot = slot_of(keys.stream(keys.partition_of(convs[0], PARTITIONS)))
    new = await asyncio.to_thread(cluster.add_primary)
    await asyncio.to_thread(cluster.add_replica, new.port)
    empty = next(s for s in range(SLOTS_TO_TRY) if s != slot and cluster.keys_in_slot(s) == 0)
    assert await asyncio.to_thread(cluster.migrate_slots, [empty], new.port) == 0
    await asyncio.sleep(2 * MAP_REFRESH_S)  # the servers' next look at the map
    conn = await a.connect()
    load = Load(conn, convs, "f")
    task = asyncio.create_task(load.run(40))
    await eventually(lambda: len(load.acked) >= 3 * len(convs), timeout=30)  # every shard
    moved = await asyncio.to_thread(cluster.migrate_slots, [slot], new.port)
    load.mark()
    await asyncio.wait_for(task, 120)
    assert moved >= 3, moved
    assert cluster.slot_owner(slot) == new.port
    assert load.back_after is not None and load.back_after < 5, load.back_after
    print(
        f"\n[fourth primary] {moved} keys moved; {load.refused} sends answered "
        "unavailable and retried"
    )
    assert len(load.acked) == 40 * len(convs)
    await assert_stored_once(stores, convs, load.acked)
    await conn.close()
    await a.aclose()
    for f in friends:
        await f.aclose()


async def _pushed_again(sender: Connection, conv: str, listener: Connection, tag: str) -> float:
    """Seconds until a send from ``sender`` reaches ``listener`` live again: one send every
    0.3 s (a send refused `unavailable` by a shard in fail-over is just tried later)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(200):
        cmid = f"{tag}-{i}"
        ack = await sender.send(conv, cmid, client_msg_id=cmid)
        if ack["ok"]:
            got = await listener.try_next_event(
                "message", 0.3, lambda f, c=cmid: f["message"]["client_msg_id"] == c
            )
            if got is not None:
                return loop.time() - start
        else:
            assert ack["code"] == "unavailable", ack
            await asyncio.sleep(0.3)
    raise AssertionError("no live push for 60 s")


async def test_the_inbox_follows_its_slot_and_its_shard(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess]
) -> None:
    """The second gateway's inbox is a sharded channel: frames for its users reach it
    through the shard of its slot. When that slot moves to another primary, and when
    that primary is killed and its replica takes over, the gateway subscribes where the
    slot now is and live pushes arrive again within seconds. Its users' registry entries
    (one key per user, any slot) live through both."""
    s1, _s2 = on_cluster
    a = await new_user(s1.url, "ia")
    b = await new_user(s1.url, "ib")
    conv = await befriend(a, b)
    b2 = await Client.login(_s2.url, str(b.username), PASSWORD, device_id="on-2")
    sender, listener = await a.connect(), await b2.connect()
    inbox_slot = slot_of(keys.inbox("cl-2"))
    rc = RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        assert rc.zrangebyscore(keys.user_nodes(int(b.user_id or 0)), "-inf", "+inf") == ["cl-2"]
        assert await _pushed_again(sender, conv, listener, "in0") < 2

        source = cluster.slot_owner(inbox_slot)
        target = next(p.port for p in cluster.primaries() if p.port != source)
        await asyncio.to_thread(cluster.migrate_slots, [inbox_slot], target)
        assert cluster.slot_owner(inbox_slot) == target
        moved_after = await _pushed_again(sender, conv, listener, "in1")

        killed_at = asyncio.get_running_loop().time()
        cluster.kill_node(target)
        try:

            def promoted() -> bool:
                try:
                    return cluster.slot_owner(inbox_slot) != target
                except EmbeddedRuntimeError:
                    return False

            await eventually(promoted, timeout=30, interval=0.2)
        finally:  # back as the new primary's replica, which the acks wait for
            await asyncio.to_thread(cluster.restart_node, target)
        await _pushed_again(sender, conv, listener, "in2")
        failed_over_after = asyncio.get_running_loop().time() - killed_at
        print(
            f"\n[inbox] live again {moved_after:.1f} s after its slot moved, "
            f"{failed_over_after:.1f} s after its shard's primary was killed (fail-over, "
            "then the killed node back as a replica)"
        )
        assert moved_after < 5 and failed_over_after < 30
    finally:
        rc.close()
        await sender.close()
        await listener.close()
        for c in (a, b, b2):
            await c.aclose()


async def test_a_start_with_another_partition_count_is_refused(
    cluster: EmbeddedCluster, on_cluster: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    """A process configured with another partition count than the keyspace recorded would
    put conversations' keys under other tags: it is refused before it serves."""
    assert on_cluster
    env = {
        **os.environ,
        **stores.env(),
        "IM_REDIS_URL": cluster.url,
        "IM_REDIS_CLUSTER": "true",
        "IM_STREAM_PARTITIONS": "8",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "im_server", "serve", "--port", "0", "--workers", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"made with {PARTITIONS} stream partitions" in done.stderr, done.stderr[-2000:]
