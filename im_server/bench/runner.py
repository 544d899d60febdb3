"""Orchestration of ``im-server bench``: start the stores, the server and the echo
baseline (unless --url), set up users, run the phases, account the server-side CPU
(gateway + Redis + PostgreSQL processes) and print the summary."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from im_server.bench.common import report
from im_server.bench.idle import idle_connections
from im_server.bench.load import percentile
from im_server.bench.phases import drain_time, hist, hist_percentile, make_pairs, run_phase, verify
from im_server.bench.stack import Local, console
from im_server.client.transport import HttpPool

# the parts of the server side in the table, in its order (the persister when apart)
PART_NAMES = {
    "gateway": "gateway",
    "persister": "persister",
    "redis": "Redis",
    "postgres": "PostgreSQL",
}


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
                split_persister=args.split_persister,
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
        async with HttpPool() as http:
            metrics0 = (await http.get(url + "/metrics")).text
        parts0 = {k: v.cpu() for k, v in local.parts().items()} if local else {}
        wal0 = await wal_position(local)
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
        wal_bytes = await wal_position(local) - wal0  # every message of the phase stored
        async with HttpPool() as http:
            metrics1 = (await http.get(url + "/metrics")).text
        lag_b, lag_a = (
            hist(metrics0, "im_persist_lag_seconds"),
            hist(metrics1, "im_persist_lag_seconds"),
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
            im["postgres_wal_bytes_per_message"] = wal_bytes / max(1, st.acked)
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


async def wal_position(local: Local | None) -> int:
    """PostgreSQL's WAL insert position in bytes (0 without local stores): what the
    stores wrote between two readings, the persister's rows and index entries first."""
    if local is None:
        return 0
    conn = await asyncpg.connect(local.dsn)
    try:
        return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))
    finally:
        await conn.close()


def load_table(res: dict[str, Any]) -> None:
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
        (
            f"{im['persist_lag_p50_ms']:.0f} / {im['persist_lag_p99_ms']:.0f} ms"
            if im["persist_lag_p99_ms"] == im["persist_lag_p99_ms"]  # not NaN
            else "(the persister's own metrics, with --split-persister)"
        ),
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
        shown = [k for k in PART_NAMES if k in by]
        t.add_row(
            "  of which " + " / ".join(PART_NAMES[k] for k in shown),
            " / ".join(f"{by[k]:.0f}" for k in shown) + " µs",
            "",
        )
        t.add_row(
            "PostgreSQL WAL per stored message",
            f"{im['postgres_wal_bytes_per_message']:,.0f} B",
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
        "--split-persister",
        action="store_true",
        help="run the persister as a process of its own: its CPU per message is shown apart",
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
        report(asyncio.run(run(args)), args.json, show)
        return 0
    try:
        import uvloop

        res = uvloop.run(main_async(args))
    except ImportError:
        res = asyncio.run(main_async(args))
    report(res, args.json, load_table)
    return 0
