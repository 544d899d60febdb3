"""The cluster scenario: one shard's failures under load, on an embedded Valkey Cluster
of 3 primaries and 3 replicas with no setting but cluster mode (64 partitions).

``./scripts/bench chaos --scenarios cluster``. One gateway and a persister of its own;
``--senders`` users per shard, each sending to its own single chat one send at a time
(an ``unavailable`` answer retried with the same client_msg_id, as a client does). Two
faults, one after the other, each with load before and after:

1. kill -9 of a primary that is never restarted (its replica is promoted; the promoted
   primary acks on its own AOF until a replica is back);
2. a slot move of a busy partition from one primary to another.

Reported: acked sends; lost (acked, not in PostgreSQL under its acked seq); duplicated
(a client_msg_id stored twice, or a seq serving two); seq violations (a sender's acked
seqs not increasing); per shard, the longest window in which its senders got no ok ack
(the failed shard's is the fail-over; the others' should be a send's latency); the other
shards' ack p99 before and during each fault.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from im_server.bench.chaos.processes import PersisterProcess
from im_server.bench.cluster import ServerProcess, Stores, pg_dsn
from im_server.client import Client, Connection
from im_server.runtime.cluster_admin import slot_of
from im_server.runtime.embedded import EmbeddedRuntimeError
from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
from im_server.services.partitions import CLUSTER_DEFAULT
from im_server.storage.redis import keys

PASSWORD = "password-1234"


@dataclass
class Sender:
    client: Client
    conn: Connection
    conv: str
    tag: str
    shard: int  # the port of the primary serving the conversation at the start
    acked: dict[str, int] = field(default_factory=dict)
    acks: list[tuple[float, float]] = field(default_factory=list)  # (sent at, latency)
    refused: int = 0
    stopping: bool = False

    async def run(self) -> None:
        n = 0
        while not self.stopping:
            cmid = f"{self.tag}-{n}"
            while True:
                t0 = time.monotonic()
                try:
                    ack = await self.conn.send(self.conv, cmid, client_msg_id=cmid, timeout=30)
                except Exception:  # noqa: BLE001 - counted as a refusal, retried
                    ack = {"ok": False, "code": "lost"}
                if ack["ok"]:
                    self.acked[cmid] = int(ack["seq"])
                    self.acks.append((t0, time.monotonic() - t0))
                    break
                self.refused += 1
                await asyncio.sleep(0.1)
            n += 1

    def longest_gap(self, start: float, end: float) -> float:
        """The longest stretch in [start, end] without an ok ack arriving."""
        times = sorted(t + dt for t, dt in self.acks if start <= t + dt <= end)
        edges = [start, *times, end]
        return max(b - a for a, b in zip(edges, edges[1:], strict=False))


def _p99(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return max(xs) if xs else None
    return statistics.quantiles(xs, n=100)[98]


def _owner(cluster: EmbeddedCluster, conv: str) -> int | None:
    try:
        return cluster.slot_owner(slot_of(keys.stream(keys.partition_of(conv, CLUSTER_DEFAULT))))
    except EmbeddedRuntimeError:
        return None


async def _senders(url: str, cluster: EmbeddedCluster, per_shard: int) -> list[Sender]:
    by_shard: dict[int, int] = {p.port: 0 for p in cluster.primaries()}
    out: list[Sender] = []
    while any(n < per_shard for n in by_shard.values()):
        a = await Client.register(url, f"cc{uuid.uuid4().hex[:10]}", PASSWORD)
        b = await Client.register(url, f"cc{uuid.uuid4().hex[:10]}", PASSWORD)
        conv = await b.accept_friend(await a.request_friend(int(b.user_id or 0)))
        await b.aclose()
        port = _owner(cluster, conv)
        if port is None or by_shard[port] >= per_shard:
            await a.aclose()
            continue
        by_shard[port] += 1
        out.append(Sender(a, await a.connect(), conv, f"c{port}-{by_shard[port]}", port))
    return out


def _fault_figures(
    senders: list[Sender], failed: set[int], t0: float, t_fault: float, t_end: float
) -> dict[str, Any]:
    others = [s for s in senders if s.shard not in failed]
    before = [dt for s in others for t, dt in s.acks if t0 <= t < t_fault]
    during = [dt for s in others for t, dt in s.acks if t_fault <= t < t_end]
    gaps: dict[int, float] = {}
    for s in senders:
        gaps[s.shard] = max(gaps.get(s.shard, 0.0), s.longest_gap(t_fault, t_end))
    p99_before, p99_during = _p99(before), _p99(during)
    return {
        "longest_refusal_window_s": {str(k): round(v, 2) for k, v in sorted(gaps.items())},
        "other_shards_p99_ms_before": round(p99_before * 1000, 1) if p99_before else None,
        "other_shards_p99_ms_during": round(p99_during * 1000, 1) if p99_during else None,
        "other_shards_acks_during": len(during),
    }


async def _verify(stores: Stores, senders: list[Sender]) -> dict[str, int]:
    acked = {(s.conv, cmid): seq for s in senders for cmid, seq in s.acked.items()}
    convs = sorted({s.conv for s in senders})
    conn = await asyncpg.connect(pg_dsn(stores))
    try:
        deadline = time.monotonic() + 60
        while True:
            rows = await conn.fetch(
                "SELECT conv_id, seq, client_msg_id FROM messages WHERE conv_id = ANY($1)", convs
            )
            if len(rows) >= len(acked) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    stored: dict[tuple[str, str], list[int]] = {}
    seqs: dict[tuple[str, int], int] = {}
    for r in rows:
        stored.setdefault((r["conv_id"], r["client_msg_id"]), []).append(int(r["seq"]))
        seqs[(r["conv_id"], int(r["seq"]))] = seqs.get((r["conv_id"], int(r["seq"])), 0) + 1
    lost = sum(1 for k, seq in acked.items() if seq not in stored.get(k, []))
    duplicated = sum(len(v) - 1 for v in stored.values()) + sum(n - 1 for n in seqs.values())
    violations = 0
    for s in senders:
        ordered = [s.acked[c] for c in sorted(s.acked, key=lambda c: int(c.rsplit("-", 1)[1]))]
        violations += sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if b <= a)
    return {
        "acked": len(acked),
        "lost": lost,
        "duplicated": duplicated,
        "seq_violations": violations,
    }


async def run(root: Path, per_shard: int = 3, load_s: float = 6.0) -> dict[str, Any]:
    """The scenario; the figures as one dict."""
    stores = await asyncio.to_thread(Stores.start, root / "stores")
    cluster = await asyncio.to_thread(start_cluster, root / "valkey")
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {
        **stores.env(),
        "IM_REDIS_URL": cluster.url,
        "IM_REDIS_CLUSTER": "true",
        "IM_REDIS_MAP_REFRESH_SECONDS": "1",
        "IM_TEST_LOG_DIR": str(logs),
    }
    persister = PersisterProcess(env, "cc-persister", logs).start()
    server = ServerProcess(env=env, extra_args=["--no-persister"]).start()
    senders: list[Sender] = []
    tasks: list[asyncio.Task[None]] = []
    out: dict[str, Any] = {"senders_per_shard": per_shard, "load_s": load_s}
    try:
        senders = await _senders(server.url, cluster, per_shard)
        tasks = [asyncio.create_task(s.run()) for s in senders]
        t0 = time.monotonic()
        await asyncio.sleep(load_s)

        # 1. kill -9 of a primary, never restarted
        victim = senders[0].shard
        t_kill = time.monotonic()
        await asyncio.to_thread(cluster.kill_node, victim)
        mine = [s.conv for s in senders if s.shard == victim]

        def promoted() -> bool:
            return all(_owner(cluster, c) not in (victim, None) for c in mine)

        # polling the cluster's own view, off the senders' event loop
        while not await asyncio.to_thread(promoted):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        t_promoted = time.monotonic()
        await asyncio.sleep(load_s)
        t_end1 = time.monotonic()
        kill = _fault_figures(senders, {victim}, t0, t_kill, t_end1)
        kill["promoted_after_s"] = round(t_promoted - t_kill, 2)
        kill["shard_killed"] = str(victim)
        out["kill_primary"] = kill

        # 2. a slot move of a busy partition (a healthy shard's) to another primary
        mover = next(s for s in senders if s.shard != victim)
        slot = slot_of(keys.stream(keys.partition_of(mover.conv, CLUSTER_DEFAULT)))
        source = await asyncio.to_thread(cluster.slot_owner, slot)
        primaries = await asyncio.to_thread(cluster.primaries)
        target = next(p.port for p in primaries if p.port != source)
        t_move = time.monotonic()
        moved = await asyncio.to_thread(cluster.migrate_slots, [slot], target)
        t_moved = time.monotonic()
        await asyncio.sleep(load_s)
        t_end2 = time.monotonic()
        move = _fault_figures(senders, {source}, t_move - load_s, t_move, t_end2)
        move.update(keys_moved=moved, move_took_s=round(t_moved - t_move, 2))
        after = [t + dt for t, dt in mover.acks if t >= t_moved]
        move["moved_conv_acked_again_s"] = round(min(after) - t_moved, 2) if after else None
        out["slot_move"] = move
    finally:
        for s in senders:
            s.stopping = True
        if tasks:
            await asyncio.wait(tasks, timeout=60)
    out.update(await _verify(stores, senders))
    out["refused_and_retried"] = sum(s.refused for s in senders)
    for s in senders:
        await s.conn.close()
        await s.client.aclose()
    server.terminate()
    persister.terminate()
    await asyncio.to_thread(cluster.stop)
    await asyncio.to_thread(stores.stop)
    return out


def print_table(res: dict[str, Any]) -> None:
    print(
        f"cluster: {res['senders_per_shard']} senders per shard, {res['load_s']:.0f} s of load "
        "around each fault"
    )
    for name in ("kill_primary", "slot_move"):
        f = res.get(name)
        if f:
            print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in f.items()))
    print(
        f"  acked {res['acked']}, lost {res['lost']}, duplicated {res['duplicated']}, "
        f"seq violations {res['seq_violations']}, refused and retried "
        f"{res['refused_and_retried']}"
    )
