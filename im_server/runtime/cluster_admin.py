"""Talking to a Valkey cluster's nodes as its operator: an admin client per node, the
``CLUSTER NODES`` view parsed, waiting for a condition, even slot ranges, and the slot of
a key. Used by the embedded cluster (``valkey_cluster.py``) and its tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from im_server.runtime.processes import HOST, EmbeddedRuntimeError

SLOTS = 16384
CLUSTER_FILE = "im-server.cluster"
NODES_CONF = "nodes.conf"
DEFAULT_NODE_TIMEOUT_MS = 1500
MIGRATE_BATCH = 100
MIGRATE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class NodeInfo:
    """What a node says about itself: ``role`` is ``primary``, ``replica`` or ``down``
    (not running, or not answering)."""

    name: str
    port: int
    pid: int | None
    role: str
    node_id: str | None
    slots: int  # how many slots it serves (primaries)


@dataclass(frozen=True)
class Peer:
    """A line of CLUSTER NODES."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    slots: frozenset[int]
    connected: bool


def known(peer: Peer | None) -> bool:
    return peer is not None and not peer.flags & {"handshake", "noaddr"}


def parse_nodes(text: str) -> dict[str, Peer]:
    peers: dict[str, Peer] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 8:
            continue
        address = words[1].split("@")[0].split(",")[0]
        port = int(address.rsplit(":", 1)[1] or 0)
        slots: set[int] = set()
        for spec in words[8:]:
            if spec.startswith("["):  # a slot being imported/migrated
                continue
            lo, _, hi = spec.partition("-")
            slots.update(range(int(lo), int(hi or lo) + 1))
        peers[words[0]] = Peer(
            node_id=words[0],
            port=port,
            flags=frozenset(words[2].split(",")),
            primary_id=None if words[3] == "-" else words[3],
            slots=frozenset(slots),
            connected=words[7] == "connected",
        )
    return peers


@contextmanager
def admin_client(port: int, password: str, timeout: float = 10.0) -> Iterator[redis.Redis]:
    """A plain connection to one node, without redis-py's retries (they would hide for
    seconds that a node is gone)."""
    client = redis.Redis(
        host=HOST,
        port=port,
        password=password,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        yield client
    finally:
        client.close()


def cmd(client: redis.Redis, *args: str | int) -> Any:
    """One command on a node (redis-py's ``execute_command`` is untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            pass
        except redis.exceptions.BusyLoadingError:
            pass
        if time.monotonic() >= deadline:
            raise EmbeddedRuntimeError(f"valkey cluster: {what} after {timeout}s")
        time.sleep(0.05)


def even_ranges(primaries: int) -> list[tuple[int, int]]:
    """The 16384 slots cut into ``primaries`` contiguous ranges of near-equal size."""
    bounds = [SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


def slot_of(key: str | bytes) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag, or of the whole key)."""
    from redis.crc import key_slot

    return int(key_slot(key.encode() if isinstance(key, str) else key))


def move_slot(
    pw: str,
    slot: int,
    source: Peer,
    target: Peer,
    view: dict[str, Peer],
    progress: Callable[[int, int], None] | None,
) -> int:
    """Move one slot with its keys from ``source`` to ``target`` (see
    ``EmbeddedCluster.migrate_slots``); the keys moved."""
    with admin_client(target.port, pw) as dst, admin_client(source.port, pw) as src:
        cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
        moved = 0
        while True:
            keys = cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
            if not keys:
                break
            cmd(
                src,
                "MIGRATE",
                HOST,
                target.port,
                "",
                0,
                MIGRATE_TIMEOUT_MS,
                "AUTH2",
                "default",
                pw,
                "KEYS",
                *keys,
            )
            moved += len(keys)
            if progress is not None:
                progress(slot, moved)
        # The target first: from here it serves the slot even if the source's update
        # were lost; then the source (its MIGRATING state ends); then everybody else.
        cmd(dst, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        cmd(src, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    for p in view.values():
        if "master" in p.flags and p.node_id not in (source.node_id, target.node_id):
            if p.flags & {"fail", "fail?"} or not (p.connected or "myself" in p.flags):
                continue
            with admin_client(p.port, pw) as other:
                cmd(other, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    return moved


# ---------------------------------------------------------------------- health


def nodes_view(port: int, password: str) -> dict[str, Peer]:
    """The cluster as the node on ``port`` sees it (CLUSTER NODES), by node id."""
    with admin_client(port, password) as c:
        return parse_nodes(str(cmd(c, "CLUSTER", "NODES")))


def state_ok(port: int, password: str) -> bool:
    with admin_client(port, password) as c:
        info = str(cmd(c, "CLUSTER", "INFO"))
    return "cluster_state:ok" in info


def agreed(ports: list[int], password: str) -> bool:
    """Every live node (on ``ports``): ``cluster_state:ok``; sees every live node
    connected, not failing, with the role, primary and slots that node gives itself; and
    (a replica) has its link to its primary up. Only then does every node hand a client
    the same map, replicas included."""
    views = {port: nodes_view(port, password) for port in ports}
    selves: dict[int, Peer] = {}
    for port, view in views.items():
        me = next((p for p in view.values() if "myself" in p.flags), None)
        if me is None:
            return False
        selves[port] = me
    for n in ports:
        if not state_ok(n, password):
            return False
        seen = {p.port: p for p in views[n].values()}
        for port, me in selves.items():
            p = seen.get(port)
            if p is None or p.node_id != me.node_id:
                return False
            if p.flags & {"handshake", "noaddr", "fail", "fail?"}:
                return False
            if "myself" not in p.flags and not p.connected:
                return False
            if ("master" in p.flags) != ("master" in me.flags):
                return False
            if p.primary_id != me.primary_id or p.slots != me.slots:
                return False
        if not all_online(n, password, {me.node_id for me in selves.values()}):
            return False
        if "slave" in selves[n].flags:
            with admin_client(n, password) as c:
                repl = c.info("replication")
            if repl.get("master_link_status") != "up":
                return False
    return True


def all_online(port: int, password: str, node_ids: set[str]) -> bool:
    """The node on ``port`` reports every one of ``node_ids`` ``online`` in CLUSTER
    SHARDS. A replica is ``loading`` there (and left out of CLUSTER SLOTS, so out of
    clients' maps) until the node has heard, by gossip, of its replication offset."""
    with admin_client(port, password) as c:
        shards = cmd(c, "CLUSTER", "SHARDS")
    health = {str(node["id"]): str(node["health"]) for shard in shards for node in shard["nodes"]}
    return all(health.get(i) == "online" for i in node_ids)
