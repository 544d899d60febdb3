"""The nodes of the embedded Valkey Cluster one by one: a node, its configuration and
launch, and the folder's manifest. The cluster as a whole is ``valkey_cluster``.

Layout, all of it 0700 folders and 0600 files, owned by the store user::

    <folder>/im-server.password   the one password: requirepass and masterauth of every node
    <folder>/im-server.cluster    the nodes' names and ports (JSON); "assembled" once formed
    <folder>/node-<n>/            one node's ``dir``: redis.conf, nodes.conf, the AOF,
                                  redis.log, redis.pid

Ports are kept in ``im-server.cluster`` because every node's ``nodes.conf`` names the
others by address: a restart must bring each node back where the others look for it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from im_server.runtime.cluster_admin import CLUSTER_FILE, NODES_CONF
from im_server.runtime.ownership import StoreUser, make_private_dir, read_private, write_private
from im_server.runtime.processes import EmbeddedRuntimeError, check_port, free_port
from im_server.runtime.redis_server import (
    CONFIG_FILE,
    EmbeddedRedis,
    launch_valkey,
    quote_conf,
    redis_config,
    redis_url,
    write_config,
)


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """What every node of one cluster is started with."""

    password: str = field(repr=False)
    appendfsync: str
    node_timeout_ms: int
    user: StoreUser


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


def node_config(s: NodeSettings, n: ClusterNode) -> str:
    extra = [
        "cluster-enabled yes",
        f"cluster-config-file {NODES_CONF}",
        f"cluster-port {n.bus_port}",
        f"cluster-node-timeout {s.node_timeout_ms}",
        # A replica however long cut off from its primary may still take over: with one
        # replica per primary, refusing would leave the slots without a server.
        "cluster-replica-validity-factor 0",
        # One shard's trouble stays on that shard: with the default (yes), every node
        # answers CLUSTERDOWN to every command while any slot has no live primary, so a
        # dead primary would stop the sends of every shard until its replica is promoted.
        "cluster-require-full-coverage no",
        f"masterauth {quote_conf(s.password)}",
        # A primary has its replicas from the start: no 5 s wait for more of them before
        # a full sync (the default), which would hold back every start and rejoin.
        "repl-diskless-sync-delay 0",
    ]
    return redis_config(n.data_dir, n.port, s.password, s.appendfsync, extra)


def launch_node(s: NodeSettings, n: ClusterNode, notes: list[str]) -> subprocess.Popen[bytes]:
    make_private_dir(n.data_dir, s.user)
    check_port(n.port, f"valkey cluster {n.name}")
    check_port(n.bus_port, f"valkey cluster {n.name} (cluster bus)")
    write_config(n.data_dir / CONFIG_FILE, node_config(s, n), s.user)
    return launch_valkey(n.data_dir, n.port, s.password, s.user, notes)


def new_node(data_dir: Path, name: str, password: str) -> ClusterNode:
    """A node not yet started, in ``data_dir``/``name``, on two free ports."""
    return ClusterNode(
        name=name,
        data_dir=data_dir / name,
        port=free_port(),
        bus_port=free_port(),
        password=password,
    )


def save_manifest(
    data_dir: Path, nodes: list[ClusterNode], user: StoreUser, *, assembled: bool
) -> None:
    """The nodes' names and ports, and whether the cluster was assembled."""
    doc = {
        "assembled": assembled,
        "nodes": [{"name": n.name, "port": n.port, "bus_port": n.bus_port} for n in nodes],
    }
    write_private(data_dir / CLUSTER_FILE, json.dumps(doc, indent=1) + "\n", user)


def load_manifest(data_dir: Path, user: StoreUser) -> dict[str, Any] | None:
    """The folder's manifest, None without one; EmbeddedRuntimeError if it is not ours."""
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


def reset_node_dir(node_dir: Path) -> None:
    """Forget a node's cluster state and data (only for an assembly that never finished)."""
    if node_dir.is_dir() and not node_dir.is_symlink():
        shutil.rmtree(node_dir)
