"""The embedded Valkey Cluster (3 primaries, 3 replicas) from the wheel: it forms with the
single node's hardening, serves a cluster client and Lua, fails over a killed primary
without losing a write a replica acknowledged, takes a fourth primary and moves slots to
it under load, and comes back from its folder with its data and topology.

One cluster serves the whole module, in file order: each test leaves it whole (all slots
served, every node running) for the next."""

from __future__ import annotations

import os
import pwd
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from im_server.runtime.cluster_admin import CLUSTER_FILE, SLOTS, slot_of
from im_server.runtime.embedded import STORE_SYSTEM_USER, EmbeddedRuntimeError
from im_server.runtime.passwords import PASSWORD_FILE, read_password
from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
from tests.support import raw_redis

NODE_TIMEOUT_MS = 1500
FAILOVER_LIMIT = 15.0  # seconds from kill -9 to a promoted replica (node timeout 1.5 s)
RECOVERY_LIMIT = 30.0  # seconds from kill -9 to a cluster client writing again

# --------------------------------------------------------------------------- helpers


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Poll ``check`` until it holds; the seconds it took. Store errors count as "not yet"."""
    t0 = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def node_client(port: int, password: str, **kw: Any) -> redis.Redis:
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": 3,
        "socket_connect_timeout": 1,
        "retry": Retry(NoBackoff(), 0),
    }
    return redis.Redis(host="127.0.0.1", port=port, password=password, **(options | kw))


def cluster_client(c: EmbeddedCluster) -> RedisCluster:
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in c.startup_nodes],
        password=c.password,
        decode_responses=True,
        socket_timeout=2,
        socket_connect_timeout=1,
    )


def cmd(port: int, password: str, *args: Any) -> Any:
    with node_client(port, password) as r:
        return r.execute_command(*args)  # type: ignore[no-untyped-call]


SlotMap = list[tuple[int, int, int, tuple[int, ...]]]


def slot_map(port: int, password: str) -> SlotMap:
    """CLUSTER SLOTS of one node: (first, last, primary port, replica ports), sorted."""
    out = []
    for entry in cmd(port, password, "CLUSTER", "SLOTS"):
        lo, hi, primary, *replicas = entry
        out.append((int(lo), int(hi), int(primary[1]), tuple(sorted(int(r[1]) for r in replicas))))
    return sorted(out)


def owner(m: SlotMap, slot: int) -> int:
    return next(p for lo, hi, p, _ in m if lo <= slot <= hi)


def role(port: int, password: str) -> str:
    return str(cmd(port, password, "ROLE")[0])


def replicas_of(c: EmbeddedCluster, primary_port: int) -> list[int]:
    node_id = cmd(primary_port, c.password, "CLUSTER", "MYID")
    lines = cmd(primary_port, c.password, "CLUSTER", "REPLICAS", node_id)
    return [int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in lines]


def tags_in_slots(count: int, prefix: str) -> list[str]:
    """``count`` hash tags, each in a slot of its own."""
    tags: dict[int, str] = {}
    i = 0
    while len(tags) < count:
        tags.setdefault(slot_of(f"{prefix}{i}"), f"{prefix}{i}")
        i += 1
    return list(tags.values())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def read_all(rc: RedisCluster, expected: dict[str, str]) -> dict[str, str | None]:
    """The keys of ``expected`` whose value differs (``None``: gone)."""
    keys = list(expected)
    got: list[str | None] = []
    for i in range(0, len(keys), 500):
        got.extend(rc.mget_nonatomic(keys[i : i + 500]))
    return {k: v for k, v in zip(keys, got, strict=True) if v != expected[k]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    t0 = time.monotonic()
    c = start_cluster(tmp_path_factory.mktemp("vcluster") / "data", node_timeout_ms=NODE_TIMEOUT_MS)
    print(f"\ncluster of 6 assembled in {time.monotonic() - t0:.2f}s")
    yield c
    c.stop()


# --------------------------------------------------------------------------- forming


def test_the_cluster_forms_with_every_slot_served(cluster: EmbeddedCluster) -> None:
    pw = cluster.password
    info = cluster.info()
    assert [i.role for i in info].count("primary") == 3
    assert [i.role for i in info].count("replica") == 3
    assert sum(i.slots for i in info) == SLOTS
    assert all(i.pid is not None and i.node_id for i in info)
    primaries = {i.port for i in info if i.role == "primary"}
    for n in cluster.nodes:
        text = cmd(n.port, pw, "CLUSTER", "INFO")
        assert "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text, text
        assert "cluster_known_nodes:6" in text and "cluster_size:3" in text, text
        # every node sees the same map: 3 primaries, each with its own one replica
        m = slot_map(n.port, pw)
        covered = sorted((lo, hi) for lo, hi, _, _ in m)
        assert covered[0][0] == 0 and covered[-1][1] == SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False))
        assert {p for _, _, p, _ in m} == primaries
        replica_sets = {p: r for _, _, p, r in m}
        assert all(len(r) == 1 for r in replica_sets.values())
        assert len({r[0] for r in replica_sets.values()}) == 3
        assert not {r[0] for r in replica_sets.values()} & primaries


def test_every_node_wants_the_password_and_keeps_the_hardening(cluster: EmbeddedCluster) -> None:
    pw = cluster.password
    for n in cluster.nodes:
        assert raw_redis(n.port, "PING")[0].startswith(b"-NOAUTH")
        assert raw_redis(n.port, "CLUSTER NODES")[0].startswith(b"-NOAUTH")
        assert raw_redis(n.port, "AUTH not-" + pw)[0].startswith(b"-WRONGPASS")
        replies = raw_redis(
            n.port,
            f"AUTH {pw}",
            "CONFIG GET requirepass",
            "REPLICAOF 127.0.0.1 1",
            "DEBUG SLEEP 0",
            "MODULE LOAD /tmp/m.so",
            "PING",
        )
        assert replies[0] == b"+OK"
        assert all(r.startswith(b"-ERR unknown command") for r in replies[1:3]), replies
        assert replies[3].startswith(b"-ERR DEBUG command not allowed"), replies
        assert replies[4].startswith(b"-ERR MODULE command not allowed"), replies
        assert replies[5] == b"+PONG"


def test_nodes_listen_on_loopback_only(cluster: EmbeddedCluster) -> None:
    others = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
        and not a.address.startswith("127.")
        and a.address != "::1"
    ]
    for n in cluster.nodes:
        pid = n.pid()
        assert pid is not None
        listening = [
            c.laddr
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert {a.ip for a in listening} == {"127.0.0.1"}, listening
        assert {a.port for a in listening} == {n.port, n.bus_port}  # clients, cluster bus
        for address in others:
            for port in (n.port, n.bus_port):
                with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                    pass


def test_the_folder_is_private(cluster: EmbeddedCluster) -> None:
    uid = pwd.getpwnam(STORE_SYSTEM_USER).pw_uid if os.geteuid() == 0 else os.geteuid()
    root = cluster.data_dir
    assert mode(root) == 0o700
    assert mode(root / PASSWORD_FILE) == 0o600 and mode(root / CLUSTER_FILE) == 0o600
    assert read_password(root) == cluster.password
    for n in cluster.nodes:
        assert n.data_dir.parent == root and mode(n.data_dir) == 0o700
        for f in ("redis.conf", "nodes.conf", "redis.log", "redis.pid"):
            assert mode(n.data_dir / f) == 0o600, f
        conf = (n.data_dir / "redis.conf").read_text()
        assert "cluster-enabled yes\n" in conf and "masterauth " in conf
        assert "bind 127.0.0.1\n" in conf and 'rename-command CONFIG ""\n' in conf
        assert "appendonly yes\n" in conf
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = (Path(dirpath) / name).lstat()
            assert not stat.S_IMODE(st.st_mode) & 0o077, (dirpath, name)
            assert st.st_uid == uid, (dirpath, name)
    for n in cluster.nodes:
        pid = n.pid()
        assert pid is not None
        p = psutil.Process(pid)
        assert p.uids().effective == uid
        assert cluster.password not in " ".join(p.cmdline())
    assert cluster.password not in cluster.display_url and cluster.password in cluster.url


def test_bad_requests_are_refused_without_a_change(cluster: EmbeddedCluster) -> None:
    pw = cluster.password
    before = slot_map(cluster.nodes[0].port, pw)
    replica = cluster.replicas()[0]
    with pytest.raises(ValueError, match="slots must be integers"):
        cluster.migrate_slots([5, SLOTS], cluster.primaries()[0].port)
    with pytest.raises(EmbeddedRuntimeError, match="is not a primary"):
        cluster.migrate_slots([0], replica.port)
    with pytest.raises(KeyError):
        cluster.migrate_slots([0], 1)
    assert slot_map(cluster.nodes[0].port, pw) == before
    with pytest.raises(ValueError):
        start_cluster(cluster.data_dir.parent / "other", primaries=0)
    with pytest.raises(ValueError):
        start_cluster(cluster.data_dir.parent / "other", node_timeout_ms=5)
    with pytest.raises(ValueError):
        start_cluster(cluster.data_dir.parent / "other", appendfsync="sometimes")
    assert not (cluster.data_dir.parent / "other").exists()


# --------------------------------------------------------------------------- serving


def test_a_cluster_client_writes_and_reads_across_slots_and_runs_lua(
    cluster: EmbeddedCluster,
) -> None:
    pw = cluster.password
    rc = cluster_client(cluster)
    try:
        expected = {f"rw:{i}": f"v{i}" for i in range(600)}
        for k, v in expected.items():
            assert rc.set(k, v) is True
        assert read_all(rc, expected) == {}
        m = slot_map(cluster.nodes[0].port, pw)
        per_primary: dict[int, int] = {}
        for k in expected:
            per_primary[owner(m, slot_of(k))] = per_primary.get(owner(m, slot_of(k)), 0) + 1
        assert len(per_primary) == 3  # the keys really spread over every primary
        for port, count in per_primary.items():
            assert cmd(port, pw, "DBSIZE") >= count

        script = (
            "redis.call('SET', KEYS[1], ARGV[1]) "
            "return {redis.call('INCR', KEYS[2]), redis.call('GET', KEYS[1])}"
        )
        assert rc.eval(script, 2, "{p7}:a", "{p7}:n", "x") == [1, "x"]
        assert rc.eval(script, 2, "{p7}:a", "{p7}:n", "y") == [2, "y"]
        home = owner(m, slot_of("{p7}"))
        assert cmd(home, pw, "GET", "{p7}:a") == "y"  # ran on the primary of {p7}'s slot
        assert cmd(home, pw, "GET", "{p7}:n") == "2"
        elsewhere = next(p for p in per_primary if p != home)
        with pytest.raises(redis.exceptions.MovedError):
            cmd(elsewhere, pw, "GET", "{p7}:a")
        # keys of two slots in one script: refused, nothing written
        with pytest.raises(redis.RedisClusterException):
            rc.eval(script, 2, "{p7}:b", "{p8}:n", "z")
        assert rc.get("{p7}:b") is None and rc.get("{p8}:n") is None
    finally:
        rc.close()


# --------------------------------------------------------------------------- fail-over


class AckedWriter(threading.Thread):
    """Writes batches of keys, one hash tag (one slot) per batch, then ``WAIT 1`` on the
    same connection to the slot's primary. A batch is acknowledged only when every SET
    answered OK and WAIT counted a replica that has it; ``acked`` holds those keys.

    The slot map is read from any live node and read again after any error (a dead
    primary, MOVED, CLUSTERDOWN)."""

    def __init__(self, c: EmbeddedCluster, tags: list[str], batch: int = 10) -> None:
        super().__init__(daemon=True)
        self.c = c
        self.tags = tags
        self.batch = batch
        self.stopping = threading.Event()
        self.acked: dict[str, str] = {}
        self.acks_by_port: dict[int, int] = {}
        self.writes_by_port: dict[int, int] = {}  # batches whose SETs all answered OK
        self.errors = 0
        self.map: SlotMap = []
        self.clients: dict[int, redis.Redis] = {}
        self.crashed: BaseException | None = None

    def refresh(self) -> None:
        for n in self.c.nodes:
            try:
                self.map = slot_map(n.port, self.c.password)
                return
            except (redis.RedisError, OSError):
                continue

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001  (reported by the test, not lost)
            self.crashed = exc
        finally:
            for client in self.clients.values():
                client.close()

    def _run(self) -> None:
        self.refresh()
        i = 0
        while not self.stopping.is_set():
            tag = self.tags[i % len(self.tags)]
            keys = [f"{{{tag}}}:w{i}:{j}" for j in range(self.batch)]
            value = f"v{i}"
            i += 1
            try:
                port = owner(self.map, slot_of(tag))
                if port not in self.clients:
                    self.clients[port] = node_client(port, self.c.password, socket_timeout=2)
                pipe = self.clients[port].pipeline(transaction=False)
                for k in keys:
                    pipe.set(k, value)
                pipe.execute_command("WAIT", 1, 500)
                replies = pipe.execute()
            except (redis.RedisError, OSError, StopIteration):
                self.errors += 1
                self.refresh()
                continue
            self.writes_by_port[port] = self.writes_by_port.get(port, 0) + 1
            if all(r is True for r in replies[:-1]) and replies[-1] >= 1:
                self.acked.update(dict.fromkeys(keys, value))
                self.acks_by_port[port] = self.acks_by_port.get(port, 0) + 1


def test_kill_9_of_a_primary_under_load_loses_no_acknowledged_write(
    cluster: EmbeddedCluster,
) -> None:
    pw = cluster.password
    victim = cluster.primaries()[0].port
    (heir,) = replicas_of(cluster, victim)
    before = slot_map(heir, pw)
    probe = next(
        f"recover:{i}" for i in range(10**6) if owner(before, slot_of(f"recover:{i}")) == victim
    )
    writer = AckedWriter(cluster, tags_in_slots(60, "fo"))
    rc = cluster_client(cluster)
    writer.start()
    try:
        wait_for(
            "acked writes on the doomed primary", lambda: writer.acks_by_port.get(victim, 0) >= 20
        )
        t_kill = time.monotonic()
        cluster.kill_node(victim)
        promoted = wait_for(
            "the replica promoted", lambda: role(heir, pw) == "master", FAILOVER_LIMIT
        )

        def client_writes() -> bool:
            return bool(rc.set(probe, "1"))

        wait_for("the cluster client writes again", client_writes, RECOVERY_LIMIT)
        recovered = time.monotonic() - t_kill
        assert recovered <= RECOVERY_LIMIT
        # the promoted primary takes writes (no replica yet, so no acknowledgement)
        base = writer.writes_by_port.get(heir, 0)
        wait_for(
            "writes on the promoted primary", lambda: writer.writes_by_port.get(heir, 0) > base
        )
        print(
            f"\nfail-over: replica promoted {promoted:.2f}s after kill -9 "
            f"(node timeout {NODE_TIMEOUT_MS} ms); cluster client writing again after "
            f"{recovered:.2f}s; writer errors during it: {writer.errors}"
        )

        cluster.restart_node(victim)
        assert role(victim, pw) == "slave"
        assert replicas_of(cluster, heir) == [victim]
        acks = writer.acks_by_port.get(heir, 0)
        wait_for(
            "acked writes on the promoted primary", lambda: writer.acks_by_port.get(heir, 0) > acks
        )
    finally:
        writer.stopping.set()
        writer.join(30)
        assert not writer.is_alive()
    assert writer.crashed is None, writer.crashed
    try:
        assert len(writer.acked) >= 200
        assert read_all(rc, writer.acked) == {}
    finally:
        rc.close()
    cluster.wait_ok()


# --------------------------------------------------------------------------- growing


def asking_calls(port: int, password: str) -> int:
    with node_client(port, password) as r:
        stats = r.info("commandstats")
    return int(stats.get("cmdstat_asking", {}).get("calls", 0))


def moved_replies(ports: list[int], password: str) -> int:
    total = 0
    for port in ports:
        with node_client(port, password) as r:
            stats = r.info("errorstats")
        total += int(stats.get("errorstat_MOVED", {}).get("count", 0))
    return total


def test_a_fourth_primary_takes_slots_while_a_client_writes(cluster: EmbeddedCluster) -> None:
    pw = cluster.password
    tags = tags_in_slots(6, "mig")
    slots = [slot_of(t) for t in tags]
    sources = sorted({owner(slot_map(cluster.nodes[0].port, pw), s) for s in slots})
    rc = cluster_client(cluster)
    expected: dict[str, str] = {}
    for t in tags:  # 250 keys a slot: three MIGRATE batches each
        pipe = rc.pipeline()
        for i in range(250):
            pipe.set(f"{{{t}}}:pre{i}", f"p{i}")
            expected[f"{{{t}}}:pre{i}"] = f"p{i}"
        pipe.execute()

    # what the slots hold before the move (earlier tests' keys may share them)
    m = slot_map(cluster.nodes[0].port, pw)
    held = {s: int(cmd(owner(m, s), pw, "CLUSTER", "COUNTKEYSINSLOT", s)) for s in slots}
    assert all(n >= 250 for n in held.values())

    new = cluster.add_primary()
    assert role(new.port, pw) == "master"
    assert {i.port: i.slots for i in cluster.info()}[new.port] == 0
    for n in cluster.nodes:
        assert f"cluster_known_nodes:{len(cluster.nodes)}" in cmd(n.port, pw, "CLUSTER", "INFO")
    # First an empty slot, so the new primary is in CLUSTER SLOTS, where cluster clients
    # learn their nodes: redis-py (8.1) cannot follow an ASK to a node it does not know
    # (redis/redis-py#4015), and a primary without slots is not listed there.
    m = slot_map(new.port, pw)
    empty = next(
        slot_of(t)
        for t in tags_in_slots(200, "empty")
        if slot_of(t) not in slots
        and cmd(owner(m, slot_of(t)), pw, "CLUSTER", "COUNTKEYSINSLOT", slot_of(t)) == 0
    )
    assert cluster.migrate_slots([empty], new.port) == 0
    wait_for(
        "the new primary listed",
        lambda: new.port in {p for _, _, p, _ in slot_map(cluster.nodes[0].port, pw)},
    )

    written: dict[str, str] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    ops = [0]

    def write_and_read() -> None:
        wc = cluster_client(cluster)
        i = 0
        try:
            while not done.is_set():
                t = tags[i % len(tags)]
                k = f"{{{t}}}:live{i}"
                try:
                    assert wc.set(k, str(i)) is True
                    written[k] = str(i)
                    pre = f"{{{t}}}:pre{i % 250}"
                    assert wc.get(pre) == expected[pre]
                except (
                    redis.RedisError,
                    OSError,
                    AssertionError,
                ) as exc:  # MOVED, ASK: the client's job
                    errors.append(exc)
                    return
                i += 1
                ops[0] = i
        finally:
            wc.close()

    asked_before = asking_calls(new.port, pw)
    moved_before = moved_replies(sources, pw)
    probe = cluster_client(cluster)
    probed: set[int] = set()

    def mid_move(slot: int, moved: int) -> None:
        # the slot half moved: keys already on the new primary and new keys are reached
        # through ASK, keys still on the old one are served there
        if slot in probed:
            return
        probed.add(slot)
        t = tags[slots.index(slot)]
        assert probe.set(f"{{{t}}}:probe", "mid") is True
        expected[f"{{{t}}}:probe"] = "mid"
        keys = [f"{{{t}}}:pre{i}" for i in range(250)]
        assert [probe.get(k) for k in keys] == [expected[k] for k in keys]

    writer = threading.Thread(target=write_and_read, daemon=True)
    writer.start()
    try:
        wait_for("the writer running", lambda: ops[0] >= 50)
        moved = cluster.migrate_slots(slots, new.port, progress=mid_move)
        after = ops[0]
        wait_for("the writer past the move", lambda: ops[0] >= after + 200 or bool(errors))
    finally:
        done.set()
        writer.join(30)
    assert not errors, errors
    assert probed == set(slots)
    assert moved >= 6 * 250
    # the client was sent on: ASK while the slots moved, MOVED once they had
    assert asking_calls(new.port, pw) > asked_before
    assert moved_replies(sources, pw) > moved_before

    def everyone_agrees() -> bool:
        return all(owner(slot_map(n.port, pw), s) == new.port for n in cluster.nodes for s in slots)

    wait_for("every node sees the new owner", everyone_agrees)
    assert {i.port: i.slots for i in cluster.info()}[new.port] == len(slots) + 1
    expected.update(written)
    try:
        assert read_all(probe, expected) == {}
    finally:
        probe.close()
        rc.close()
    # every key of the moved slots is on the new primary, and only there
    counts = dict(held)
    for k in written:
        counts[slot_of(k)] += 1
    for t in tags:
        counts[slot_of(t)] += 1  # the probe written mid-move
    for s in slots:
        assert cmd(new.port, pw, "CLUSTER", "COUNTKEYSINSLOT", s) == counts[s]
        for src in sources:
            assert cmd(src, pw, "CLUSTER", "COUNTKEYSINSLOT", s) == 0
    cluster.wait_ok()


# --------------------------------------------------------------------------- restarting


def test_stop_and_start_of_the_folder_keeps_data_and_topology(cluster: EmbeddedCluster) -> None:
    pw = cluster.password
    rc = cluster_client(cluster)
    try:
        expected = {f"keep:{i}": f"k{i}" for i in range(500)}
        for k, v in expected.items():
            rc.set(k, v)
    finally:
        rc.close()
    roles = {i.port: (i.role, i.node_id, i.slots) for i in cluster.info()}
    before = slot_map(cluster.nodes[0].port, pw)
    pids = [n.pid() for n in cluster.nodes]
    cluster.stop()
    assert all(p is not None and not psutil.pid_exists(p) for p in pids)
    assert all(n.pid() is None for n in cluster.nodes)

    t0 = time.monotonic()
    again = start_cluster(cluster.data_dir)
    print(f"\ncluster of {len(again.nodes)} restarted in {time.monotonic() - t0:.2f}s")
    try:
        assert again.password == pw
        assert [n.port for n in again.nodes] == [n.port for n in cluster.nodes]
        assert {i.port: (i.role, i.node_id, i.slots) for i in again.info()} == roles
        for n in again.nodes:
            assert slot_map(n.port, pw) == before
        rc = cluster_client(again)
        try:
            assert read_all(rc, expected) == {}
        finally:
            rc.close()
    finally:
        again.stop()
