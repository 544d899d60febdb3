"""Orchestration of ``im-server bench``: start the stores, the server and the echo
baseline (unless --url), set up users, run the phases, account the server-side CPU
(gateway + Redis + PostgreSQL processes) and print the summary."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from im_server.bench.idle import idle_connections
from im_server.bench.load import Pacer, Stats, open_ws, percentile, receiver, sender, ws_url

console = Console(stderr=True)
BENCH_ENV = {
    "IM_MAX_CONNECTIONS_PER_USER": "1000000",
    "IM_ARGON2_TIME_COST": "1",
    "IM_ARGON2_MEMORY_KIB": "1024",
    "IM_RATE_SEND_PER_S": "0",
    "IM_RATE_READ_PER_S": "0",
    "IM_RATE_TYPING_PER_S": "0",
    "IM_LOG_LEVEL": "WARNING",
}


@dataclass
class Procs:
    """Server-side processes whose CPU time is counted."""

    pids: list[int] = field(default_factory=list)
    tree_roots: list[int] = field(default_factory=list)  # counted with all descendants

    def cpu(self) -> float:
        total = 0.0
        seen: set[int] = set()
        procs: list[psutil.Process] = []
        for pid in self.pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        for pid in self.tree_roots:
            try:
                root = psutil.Process(pid)
                procs.append(root)
                procs.extend(root.children(recursive=True))
            except psutil.Error:
                pass
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def rss(self) -> int:
        total = 0
        for pid in self.pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return total


def free_port() -> int:
    from im_server.runtime.embedded import free_port as fp

    return fp()


def wait_http(url: str, path: str = "/readyz", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not ready")


def wait_port(port: int, timeout: float = 30) -> None:
    from im_server.runtime.embedded import wait_for_port

    wait_for_port("127.0.0.1", port, timeout)


class Local:
    """Stores + im-server + echo, started by the bench itself: a single Valkey, or a
    Valkey Cluster of ``cluster`` primaries with a replica each; ``gateways`` server
    processes (receivers connect to the last one, so with two a message crosses
    processes), each ``serve --workers workers``; ``partitions`` stream partitions."""

    def __init__(
        self,
        root: Path,
        *,
        cluster: int = 0,
        gateways: int = 1,
        partitions: int = 1,
        workers: int = 1,
    ) -> None:
        from im_server.runtime.embedded import start_postgres, start_redis, start_s3
        from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
        from im_server.storage.db import run_migrations

        self.pg = start_postgres(root / "pg", fsync=True)
        self.cluster: EmbeddedCluster | None = None
        self.redis = None
        if cluster:
            self.cluster = start_cluster(root / "valkey", primaries=cluster)
            redis_url = self.cluster.url
        else:
            self.redis = start_redis(root / "redis")
            redis_url = self.redis.url
        self.redis_url = redis_url
        self.partitions = partitions
        self.s3 = start_s3(root / "s3")
        run_migrations(self.pg.url)
        env = {
            **os.environ,
            **BENCH_ENV,
            "IM_DATABASE_URL": self.pg.url,
            "IM_REDIS_URL": redis_url,
            "IM_REDIS_CLUSTER": "true" if cluster else "false",
            "IM_STREAM_PARTITIONS": str(partitions),
            **self.s3.env(),
        }
        self.log = open(root / "server.log", "wb")
        self.servers: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        for i in range(gateways):
            port = free_port()
            self.servers.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "im_server", "serve", "--port", str(port)),
                        *("--workers", str(workers)),
                    ],
                    env={**env, "IM_NODE_NAME": f"bench-{i + 1}"},
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                )
            )
            self.urls.append(f"http://127.0.0.1:{port}")
            wait_http(self.urls[-1])
        self.url = self.urls[0]
        self.recv_url = self.urls[-1]
        self.echo_port = free_port()
        self.echo = subprocess.Popen(
            [sys.executable, "-m", "im_server.bench.echo", str(self.echo_port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.echo_port)

    def _redis_pids(self) -> list[int]:
        if self.cluster is not None:
            return [n.pid() or 0 for n in self.cluster.nodes]
        return [self.redis.pid() or 0] if self.redis is not None else []

    def im_procs(self) -> Procs:
        """Server processes: a serve's workers are counted with it."""
        return Procs(
            pids=self._redis_pids(),
            tree_roots=[self.pg.pid() or 0] + [s.pid for s in self.servers],
        )

    def parts(self) -> dict[str, Procs]:
        return {
            "gateway": Procs(tree_roots=[s.pid for s in self.servers]),
            "redis": Procs(pids=self._redis_pids()),
            "postgres": Procs(tree_roots=[self.pg.pid() or 0]),
        }

    def echo_procs(self) -> Procs:
        return Procs(pids=[self.echo.pid])

    def stop(self) -> None:
        for p in (*self.servers, self.echo):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.s3.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self.redis is not None:
            self.redis.stop()
        self.pg.stop()
        self.log.close()


async def make_pairs(url: str, n: int) -> list[tuple[str, str, str, int]]:
    """n befriended pairs: (sender token, receiver token, conv_id, sender id)."""
    from im_server.client import Client

    tag = uuid.uuid4().hex[:6]

    async def one(i: int) -> tuple[str, str, str, int]:
        a = await Client.register(url, f"bs{tag}{i}", "bench-password")
        b = await Client.register(url, f"br{tag}{i}", "bench-password")
        conv = await b.accept_friend(await a.request_friend(b.user_id))  # type: ignore[arg-type]
        out = (a.token or "", b.token or "", conv, a.user_id or 0)
        await a.aclose()
        await b.aclose()
        return out

    sem = asyncio.Semaphore(16)

    async def guarded(i: int) -> tuple[str, str, str, int]:
        async with sem:
            return await one(i)

    return list(await asyncio.gather(*(guarded(i) for i in range(n))))


async def phase_bar(
    name: str, duration: float, rate: Callable[[float], str], *, show: bool = True
) -> None:
    """Wait out a timed phase under a transient bar, ``rate(elapsed)`` beside it."""
    with Progress(
        TextColumn(f"[bold]{name}"),
        BarColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not show,
    ) as prog:
        task = prog.add_task(name, total=duration, rate="")
        t0 = time.monotonic()
        while (el := time.monotonic() - t0) < duration:
            await asyncio.sleep(0.2)
            prog.update(task, completed=el, rate=rate(el))


async def run_phase(
    name: str,
    url: str,
    pairs: list[tuple[str, str, str, int]],
    window: int,
    duration: float,
    size: int,
    procs: Procs | None,
    rate: float | None = None,
    echo_url: str | None = None,
    recv_url: str | None = None,
    ready: Callable[[], object] | None = None,
    progress: bool = True,
) -> tuple[Stats, float]:
    """One timed phase; returns the stats and the server CPU seconds it cost. ``ready``
    is called once the sockets are open, just before the clock starts (client processes
    meet there); ``progress`` False shows no bar."""
    stats = Stats()
    stop = asyncio.Event()
    pacer = Pacer(rate)
    if echo_url:
        senders = [await open_ws(echo_url) for _ in pairs]
        receivers = [await open_ws(echo_url) for _ in pairs]  # idle, as many connections
    else:
        senders = [await open_ws(ws_url(url, p[0])) for p in pairs]
        receivers = [await open_ws(ws_url(recv_url or url, p[1])) for p in pairs]
    rtasks = [asyncio.create_task(receiver(r, stats)) for r in receivers] if not echo_url else []
    if ready is not None:
        ready()
    cpu0 = procs.cpu() if procs else 0.0
    stats.started = time.perf_counter()
    stasks = [
        asyncio.create_task(
            sender(ws, p[2], f"{name}{i}", window, size, stats, stop, pacer, echo=bool(echo_url))
        )
        for i, (ws, p) in enumerate(zip(senders, pairs, strict=True))
    ]
    await phase_bar(
        name, duration, lambda el: f"{stats.acked / max(el, 1e-9):,.0f}/s acked", show=progress
    )
    stop.set()
    await asyncio.gather(*stasks, return_exceptions=True)
    stats.stopped = time.perf_counter()
    if not echo_url:  # deliveries of the last acks
        deadline = time.monotonic() + 5
        while stats.delivered + stats.duplicates < stats.acked and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    cpu = (procs.cpu() - cpu0) if procs else float("nan")
    for ws in senders + receivers:
        await ws.close()
    for t in rtasks:
        t.cancel()
    return stats, cpu


def _hist(text: str, name: str) -> list[tuple[float, float]]:
    out = []
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} ([0-9.e+]+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        out.append((le, float(m.group(2))))
    return out


def hist_percentile(
    before: list[tuple[float, float]], after: list[tuple[float, float]], p: float
) -> float:
    """Upper bucket bound holding the p-th percentile of what was observed in between."""
    b = dict(before)
    deltas = [(le, c - b.get(le, 0.0)) for le, c in after]
    total = deltas[-1][1] if deltas else 0
    if total <= 0:
        return float("nan")
    for le, c in deltas:
        if c >= total * p / 100:
            return le
    return float("inf")


async def verify(
    local: Local | None, url: str, stats: Stats, tokens: dict[str, str]
) -> tuple[int, int]:
    """(lost, duplicated): acked but not delivered or not in PostgreSQL; delivered or
    stored twice."""
    lost = 0
    for conv, seqs in stats.acked_seqs.items():
        lost += len(seqs - stats.delivered_seqs.get(conv, set()))
    dup = stats.duplicates
    if local is not None:
        import asyncpg

        conn = await asyncpg.connect(local.pg.url.replace("postgresql+asyncpg", "postgresql"))
        try:
            for conv, seqs in stats.acked_seqs.items():
                rows = await conn.fetch(
                    "SELECT seq FROM messages WHERE conv_id = $1 AND seq = ANY($2::bigint[])",
                    conv,
                    list(seqs),
                )
                lost += len(seqs) - len({r["seq"] for r in rows})
            dup += int(
                await conn.fetchval(
                    "SELECT count(*) - count(DISTINCT (sender_id, client_msg_id)) FROM messages"
                )
            )
        finally:
            await conn.close()
    return lost, dup


async def drain_time(local: Local | None, timeout: float = 30) -> tuple[int, float]:
    """Stream depth (all partitions) when the load stopped, and seconds until it was 0."""
    if local is None:
        return -1, float("nan")
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    from im_server.storage.redis import keys

    r: Any = (
        RedisCluster.from_url(local.redis_url)
        if local.cluster is not None
        else aioredis.Redis.from_url(local.redis_url)
    )

    async def depth() -> int:
        return sum([int(await r.xlen(keys.stream(p))) for p in range(local.partitions)])

    try:
        t0 = time.monotonic()
        depth0 = await depth()
        while time.monotonic() - t0 < timeout:
            if await depth() == 0:
                return depth0, time.monotonic() - t0
            await asyncio.sleep(0.01)
        return depth0, float("inf")
    finally:
        await r.aclose()


def ms(x: float) -> str:
    return "n/a" if x != x else f"{x * 1000:.1f} ms"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    local: Local | None = None
    tmp = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            tmp = tempfile.TemporaryDirectory(prefix="im-bench-")
            console.print("starting PostgreSQL, Redis, im-server and the echo baseline …")
            local = Local(
                Path(tmp.name),
                cluster=args.cluster,
                gateways=args.gateways,
                partitions=args.partitions,
            )
            url = local.url
        pairs = await make_pairs(url, args.pairs)
        result: dict[str, Any] = {
            "pairs": args.pairs,
            "window": args.window,
            "duration_s": args.duration,
            "size": args.size,
            "cluster_primaries": args.cluster,
            "gateways": args.gateways,
            "partitions": args.partitions,
        }
        recv_url = local.recv_url if local is not None else None
        if local is not None:
            echo_stats, echo_cpu = await run_phase(
                "echo",
                url,
                pairs,
                args.window,
                args.duration,
                args.size,
                local.echo_procs(),
                echo_url=f"ws://127.0.0.1:{local.echo_port}/",
            )
            result["echo"] = {
                "round_trips_per_s": echo_stats.acked / echo_stats.seconds,
                "rtt_p50_ms": percentile(echo_stats.ack_latency, 50) * 1000,
                "rtt_p99_ms": percentile(echo_stats.ack_latency, 99) * 1000,
                "server_cpu_s": echo_cpu,
                "server_cpu_us_per_round_trip": echo_cpu / max(1, echo_stats.acked) * 1e6,
            }
        async with httpx.AsyncClient() as http:
            metrics0 = (await http.get(url + "/metrics")).text
        parts0 = {k: v.cpu() for k, v in local.parts().items()} if local else {}
        st, cpu = await run_phase(
            "im",
            url,
            pairs,
            args.window,
            args.duration,
            args.size,
            local.im_procs() if local else None,
            recv_url=recv_url,
        )
        parts1 = {k: v.cpu() for k, v in local.parts().items()} if local else {}
        depth, drain_s = await drain_time(local)
        async with httpx.AsyncClient() as http:
            metrics1 = (await http.get(url + "/metrics")).text
        lag_b, lag_a = (
            _hist(metrics0, "im_persist_lag_seconds"),
            _hist(metrics1, "im_persist_lag_seconds"),
        )
        lost, dup = await verify(local, url, st, {})
        im = {
            "messages_acked_per_s": st.acked / st.seconds,
            "messages_delivered_per_s": st.delivered / st.seconds,
            "acked": st.acked,
            "refused": st.refused,
            "ack_p50_ms": percentile(st.ack_latency, 50) * 1000,
            "ack_p99_ms": percentile(st.ack_latency, 99) * 1000,
            "ack_p999_ms": percentile(st.ack_latency, 99.9) * 1000,
            "delivery_p50_ms": percentile(st.delivery_latency, 50) * 1000,
            "delivery_p99_ms": percentile(st.delivery_latency, 99) * 1000,
            "delivery_p999_ms": percentile(st.delivery_latency, 99.9) * 1000,
            "persist_lag_p50_ms": hist_percentile(lag_b, lag_a, 50) * 1000,
            "persist_lag_p99_ms": hist_percentile(lag_b, lag_a, 99) * 1000,
            "stream_depth_at_stop": depth,
            "stream_drained_in_s": drain_s,
            "lost": lost,
            "duplicated": dup,
            "errors": st.errors[:5],
        }
        if local is not None:
            im["server_cpu_s"] = cpu
            im["server_cpu_us_per_message"] = cpu / max(1, st.delivered) * 1e6
            im["messages_per_server_cpu_s"] = st.delivered / cpu if cpu > 0 else float("nan")
            im["cpu_ratio_to_echo"] = (
                im["server_cpu_us_per_message"] / result["echo"]["server_cpu_us_per_round_trip"]
            )
            im["server_cpu_us_per_message_by_process"] = {
                k: (parts1[k] - parts0[k]) / max(1, st.delivered) * 1e6 for k in parts0
            }
        result["im"] = im
        if args.half_rate and st.acked:
            rate = st.acked / st.seconds / 2
            hst, hcpu = await run_phase(
                "half",
                url,
                pairs,
                args.window,
                args.duration,
                args.size,
                local.im_procs() if local else None,
                rate=rate,
                recv_url=recv_url,
            )
            result["im_half_rate"] = {
                "target_per_s": rate,
                "messages_acked_per_s": hst.acked / hst.seconds,
                "delivery_p50_ms": percentile(hst.delivery_latency, 50) * 1000,
                "delivery_p99_ms": percentile(hst.delivery_latency, 99) * 1000,
                "delivery_p999_ms": percentile(hst.delivery_latency, 99.9) * 1000,
                "ack_p99_ms": percentile(hst.ack_latency, 99) * 1000,
            }
        return result
    finally:
        if local is not None:
            local.stop()
        if tmp is not None:
            tmp.cleanup()


async def register_many(url: str, n: int, tag: str) -> list[Any]:
    from im_server.client import Client

    sem = asyncio.Semaphore(16)

    async def one(i: int) -> Any:
        async with sem:
            return await Client.register(url, f"{tag}{i}", "bench-password")

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def report(res: dict[str, Any]) -> None:
    t = Table(
        title=f"im-server bench: {res['pairs']} pairs × window {res['window']}, {res['duration_s']} s, {res['size']}-byte text"
    )
    t.add_column("figure")
    t.add_column("im-server", justify="right")
    t.add_column("bare echo", justify="right")
    im, echo = res["im"], res.get("echo", {})
    t.add_row(
        "messages (round trips) / s",
        f"{im['messages_acked_per_s']:,.0f} acked, {im['messages_delivered_per_s']:,.0f} delivered",
        f"{echo.get('round_trips_per_s', float('nan')):,.0f}",
    )
    t.add_row(
        "ack latency p50 / p99 / p99.9",
        f"{im['ack_p50_ms']:.1f} / {im['ack_p99_ms']:.1f} / {im['ack_p999_ms']:.1f} ms",
        f"{echo.get('rtt_p50_ms', float('nan')):.1f} / {echo.get('rtt_p99_ms', float('nan')):.1f} ms",
    )
    t.add_row(
        "delivery latency p50 / p99 / p99.9",
        f"{im['delivery_p50_ms']:.1f} / {im['delivery_p99_ms']:.1f} / {im['delivery_p999_ms']:.1f} ms",
        "",
    )
    t.add_row(
        "persister lag p50 / p99 (bucket bound)",
        f"{im['persist_lag_p50_ms']:.0f} / {im['persist_lag_p99_ms']:.0f} ms",
        "",
    )
    t.add_row(
        "stream depth at stop → drained in",
        f"{im['stream_depth_at_stop']} → {im['stream_drained_in_s']:.2f} s",
        "",
    )
    t.add_row("lost / duplicated", f"{im['lost']} / {im['duplicated']}", "")
    if "server_cpu_us_per_message" in im:
        t.add_row(
            "server CPU per message (round trip)",
            f"{im['server_cpu_us_per_message']:.0f} µs",
            f"{echo['server_cpu_us_per_round_trip']:.0f} µs",
        )
        by = im["server_cpu_us_per_message_by_process"]
        t.add_row(
            "  of which gateway / Redis / PostgreSQL",
            " / ".join(f"{by[k]:.0f}" for k in ("gateway", "redis", "postgres")) + " µs",
            "",
        )
        t.add_row("ratio to echo", f"{im['cpu_ratio_to_echo']:.2f}×", "1×")
        t.add_row("messages per server CPU-second", f"{im['messages_per_server_cpu_s']:,.0f}", "")
    if "im_half_rate" in res:
        h = res["im_half_rate"]
        t.add_row(
            "at half rate: delivery p50 / p99 / p99.9",
            f"{h['delivery_p50_ms']:.1f} / {h['delivery_p99_ms']:.1f} / {h['delivery_p999_ms']:.1f} ms ({h['messages_acked_per_s']:,.0f}/s)",
            "",
        )
    Console().print(t)


def _idle_report(res: dict[str, Any]) -> None:
    t = Table(title="im-server bench: idle connections")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in res.items():
        t.add_row(k, f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="im-server bench",
        description="Load benchmark with a bare-echo baseline in the same run",
    )
    p.add_argument("--url", help="an existing server (default: start stores, server and echo here)")
    p.add_argument(
        "--pairs", type=int, default=50, help="one-to-one pairs (a sender and a receiver each)"
    )
    p.add_argument("--window", type=int, default=10, help="sends in flight per sender")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    p.add_argument("--size", type=int, default=60, help="text length of each message")
    p.add_argument(
        "--half-rate", action="store_true", help="also run at half the measured rate (latency)"
    )
    p.add_argument(
        "--cluster",
        type=int,
        default=0,
        help="run the stores' Redis as a Valkey Cluster of this many primaries (a replica each)",
    )
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="server processes (receivers on the last; with --group, members split evenly)",
    )
    p.add_argument(
        "--partitions", type=int, default=1, help="stream partitions (IM_STREAM_PARTITIONS)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="instead: the one-to-one phase on serve --workers 1, then --workers N (scaling)",
    )
    p.add_argument(
        "--client-procs", type=int, default=1, help="with --workers: load client processes"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--idle", type=int, default=0, help="instead: hold this many idle WebSockets, report memory"
    )
    p.add_argument("--idle-seconds", type=float, default=60.0, help="--idle: CPU measured over")
    p.add_argument("--idle-deflate", action="store_true", help="--idle: clients ask for deflate")
    p.add_argument(
        "--group", type=int, default=0, help="instead: fan-out in a group of this many members"
    )
    p.add_argument(
        "--clients", type=int, default=0, help="with --group: receiving load processes (0: auto)"
    )
    args = p.parse_args(argv)
    mode: (
        tuple[
            Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
            Callable[[dict[str, Any]], None],
        ]
        | None
    ) = None
    if args.workers:
        from im_server.bench import scaling

        mode = (scaling.compare, scaling.report)
    elif args.group:
        from im_server.bench import groups

        mode = (groups.group_fanout, groups.report)
    elif args.idle:
        mode = (idle_connections, _idle_report)
    if mode is not None:
        run, show = mode
        res = asyncio.run(run(args))
        if args.json:
            print(orjson.dumps(res, option=orjson.OPT_INDENT_2).decode())
        else:
            show(res)
        return 0
    try:
        import uvloop

        res = uvloop.run(main_async(args))
    except ImportError:
        res = asyncio.run(main_async(args))
    if args.json:
        print(orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        report(res)
    return 0
