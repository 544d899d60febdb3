"""The server on a Valkey Cluster (3 primaries, 3 replicas, started from the wheel):
`IM_REDIS_CLUSTER=true`, 8 stream partitions spread over the shards, two gateway
processes. Sends to conversations of every shard are acked with dense seqs, reach the
other process's devices, are deduplicated and stored once; logins (script calls on
counters of different slots) and presence work; no call crosses slots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from im_server.client import ApiError, Client
from im_server.runtime.valkey_cluster import EmbeddedCluster, slot_of, start_cluster
from im_server.storage.redis import keys
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    linked_servers,
    new_user,
    pg,
)

PARTITIONS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster-mode") / "valkey")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def on_cluster(
    stores: Stores, cluster: EmbeddedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {
        **stores.env(),
        "IM_REDIS_URL": cluster.url,
        "IM_REDIS_CLUSTER": "true",
        "IM_STREAM_PARTITIONS": str(PARTITIONS),
        "IM_TEST_LOG_DIR": str(tmp_path_factory.mktemp("cluster-logs")),
    }
    with linked_servers(env, "cl-1", "cl-2") as pair:
        yield pair


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
    assert len(set(owners.values())) >= 2, owners  # the partitions do span shards

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
