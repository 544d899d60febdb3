"""Fan-out in one big group (``im-server bench --group N``): every member connected, one
sender keeping ``--window`` sends in flight, every member's socket timing each delivery.

With ``--gateways 2`` the members' sockets are split between two server processes (half
on each, the sender on the first), so half of the deliveries cross processes over Redis
pub/sub. The receiving sockets are held by ``--clients`` load processes: a group of N
members turns each message into N - 1 frames to parse, and one Python process parsing
them would measure itself rather than the server. The CPU of every process, the load's
too, is printed, so a saturated load process shows.

Checked: every member got every acked message exactly once (lost, duplicated)."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from im_server.bench.load import Pacer, Stats, open_ws, percentile, sender, ws_url
from im_server.bench.stack import Local, Procs
from im_server.client.transport import HttpPool, TransportError

OPEN_AT_ONCE = 64  # sockets being opened at the same time, per load process
DRAIN_S = 15.0  # how long the last deliveries may take after the last ack


@dataclass
class Share:
    """What one load process saw on its members' sockets."""

    members: int
    delivered: int = 0  # acked messages, once per member
    duplicates: int = 0
    lost: int = 0  # acked messages a member never got
    latency: list[float] = field(default_factory=list)
    by_gateway: dict[str, list[float]] = field(default_factory=dict)  # the same, by socket's server
    last_delivery: float = 0.0  # wall clock
    errors: list[str] = field(default_factory=list)


class Member:
    """One receiving socket: the seqs it got and when (``t`` is the sender's wall clock,
    the load processes share the machine's)."""

    __slots__ = ("seqs", "duplicates", "latency", "last")

    def __init__(self) -> None:
        self.seqs: set[int] = set()
        self.duplicates = 0
        self.latency: list[tuple[int, float]] = []
        self.last = 0.0

    async def listen(self, ws: Any, errors: list[str]) -> None:
        try:
            async for raw in ws:
                f = orjson.loads(raw)
                if f.get("type") != "message":
                    continue
                m = f["message"]
                seq = m["seq"]
                if seq in self.seqs:
                    self.duplicates += 1
                    continue
                self.seqs.add(seq)
                t = m["content"].get("t")
                if t:
                    now = time.time()
                    self.latency.append((seq, now - t))
                    self.last = now
        except Exception as e:  # noqa: BLE001 - the run reports it
            if "1000" not in repr(e) and "1001" not in repr(e):
                errors.append(repr(e))


async def _hold(pipe: Connection, urls: list[str]) -> None:
    """A load process: open the sockets, say so; then per phase, wait for its acked seqs,
    wait until every member has them (or DRAIN_S), answer with a :class:`Share`; None
    ends it."""
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    members = [Member() for _ in urls]
    sem = asyncio.Semaphore(OPEN_AT_ONCE)

    async def one(url: str) -> Any:
        async with sem:
            return await open_ws(url)

    socks = await asyncio.gather(*(one(u) for u in urls))
    tasks = [
        asyncio.create_task(m.listen(ws, errors)) for m, ws in zip(members, socks, strict=True)
    ]
    pipe.send(len(socks))
    dups = 0
    while (acked := await loop.run_in_executor(None, pipe.recv)) is not None:
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and any(not acked <= m.seqs for m in members):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        share = Share(members=len(members), errors=errors)
        for m, url in zip(members, urls, strict=True):
            share.delivered += len(m.seqs & acked)
            share.by_gateway.setdefault(url.split("/v1/")[0], []).extend(
                lat for seq, lat in m.latency if seq in acked
            )
            share.lost += len(acked - m.seqs)
            share.duplicates += m.duplicates
            share.latency.extend(lat for seq, lat in m.latency if seq in acked)
            share.last_delivery = max(share.last_delivery, m.last)
        share.duplicates, dups = share.duplicates - dups, share.duplicates
        pipe.send(share)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*(ws.close() for ws in socks), return_exceptions=True)


def _load_process(pipe: Connection, urls: list[str]) -> None:
    _raise_nofile()
    try:
        import uvloop

        uvloop.run(_hold(pipe, urls))
    except ImportError:
        asyncio.run(_hold(pipe, urls))


def _raise_nofile() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _register(url: str, n: int) -> list[Any]:
    from im_server.client import Client

    tag = f"grp{uuid.uuid4().hex[:6]}"
    http = HttpPool(timeout=60, max_connections=32)
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> Any:
        """A pooled connection the server closed as it was reused fails the request:
        register again under a fresh name (the first may or may not exist)."""
        async with sem:
            for attempt in range(3):
                try:
                    name = f"{tag}{i}r{attempt}"
                    return await Client.register(url, name, "bench-password", http=http)
                except TransportError:
                    if attempt == 2:
                        raise

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def _cpu(procs: dict[str, Procs]) -> dict[str, float]:
    return {k: p.cpu() for k, p in procs.items()}


class Phase:
    """One timed phase on the open sockets: the sender as fast as its window allows, or
    paced to ``rate`` messages per second."""

    def __init__(
        self,
        conv: str,
        members: int,
        args: argparse.Namespace,
        ws: Any,
        procs: dict[str, Procs],
        pipes: list[Connection],
        gateways: list[str],
    ) -> None:
        self.conv, self.members, self.args, self.ws = conv, members, args, ws
        self.procs, self.pipes = procs, pipes
        self.gateway_names = {ws_url(u, None): f"gateway {i + 1}" for i, u in enumerate(gateways)}
        self.n = 0

    async def run(self, rate: float | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self.n += 1
        cpu0 = _cpu(self.procs)
        load0 = os.getloadavg()[0]
        stats = Stats()
        stop = asyncio.Event()
        started = time.time()
        st = asyncio.create_task(
            sender(
                self.ws,
                self.conv,
                f"g{self.n}",
                self.args.window,
                self.args.size,
                stats,
                stop,
                Pacer(rate),
            )
        )
        await asyncio.sleep(self.args.duration)
        stop.set()
        await st
        acked = stats.acked_seqs.get(self.conv, set())
        for pipe in self.pipes:
            pipe.send(acked)
        shares: list[Share] = [await loop.run_in_executor(None, p.recv) for p in self.pipes]
        cpu1 = _cpu(self.procs)
        wall = max(max(s.last_delivery for s in shares) - started, 1e-9)
        delivered = sum(s.delivered for s in shares)
        latency = [x for s in shares for x in s.latency]
        by_gateway: dict[str, list[float]] = {}
        for sh in shares:
            for base, lats in sh.by_gateway.items():
                by_gateway.setdefault(self.gateway_names.get(base, base), []).extend(lats)
        used = {k: cpu1[k] - cpu0[k] for k in self.procs}
        server_cpu = sum(v for k, v in used.items() if not k.startswith("load"))
        per = max(1, delivered)
        return {
            "target_messages_per_s": rate,
            "messages_acked": stats.acked,
            "refused": stats.refused,
            "deliveries": delivered,
            "deliveries_expected": len(acked) * (self.members - 1),
            "lost": sum(s.lost for s in shares),
            "duplicated": sum(s.duplicates for s in shares),
            "wall_s": wall,
            "deliveries_per_s": delivered / wall,
            "messages_per_s": len(acked) / wall,
            "ack_p50_ms": percentile(stats.ack_latency, 50) * 1000,
            "ack_p99_ms": percentile(stats.ack_latency, 99) * 1000,
            "delivery_p50_ms": percentile(latency, 50) * 1000,
            "delivery_p99_ms": percentile(latency, 99) * 1000,
            "delivery_p999_ms": percentile(latency, 99.9) * 1000,
            "delivery_p50_p99_ms_by_gateway": {
                k: [percentile(v, 50) * 1000, percentile(v, 99) * 1000]
                for k, v in sorted(by_gateway.items())
            },
            "server_cpu_s": server_cpu,
            "server_cpu_us_per_delivery": server_cpu / per * 1e6,
            "cpu_us_per_delivery_by_process": {k: used[k] / per * 1e6 for k in self.procs},
            "cpu_share_of_a_core_by_process": {k: used[k] / wall for k in self.procs},
            "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "errors": ([*stats.errors, *(e for s in shares for e in s.errors)])[:5],
        }


async def group_fanout(args: argparse.Namespace) -> dict[str, Any]:
    """Deliveries per second in a group of ``--group`` members, all connected."""
    _raise_nofile()
    n, gateways = args.group, max(1, args.gateways)
    clients = args.clients or max(1, round(n / 1500))
    tmp = tempfile.TemporaryDirectory(prefix="im-bench-")
    local = Local(Path(tmp.name), gateways=gateways)
    workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    loop = asyncio.get_running_loop()
    try:
        t_setup = time.monotonic()
        members = await _register(local.url, n)
        owner = members[0]
        conv = (await owner.create_group("bench", [m.user_id for m in members[1:]]))["conv_id"]
        # member i on gateway i % gateways: the sender (0) on the first, the rest alternate
        urls = [ws_url(local.urls[i % gateways], m.token) for i, m in enumerate(members)]
        ctx = multiprocessing.get_context("spawn")
        for k in range(clients):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(
                target=_load_process, args=(theirs, urls[1 + k :: clients]), daemon=True
            )
            p.start()
            workers.append((p, ours))
        held = sum([await loop.run_in_executor(None, pipe.recv) for _, pipe in workers])
        sender_ws = await open_ws(urls[0])
        # one message first: the gateways load the member list, the sockets are warm
        await sender_ws.send(
            orjson.dumps(
                {
                    "type": "send",
                    "client_msg_id": "warm",
                    "conv_id": conv,
                    "content_type": "text",
                    "content": {"text": "warm"},
                }
            ).decode()
        )
        await asyncio.sleep(2)
        setup_s = time.monotonic() - t_setup

        procs: dict[str, Procs] = {
            **{f"gateway {i + 1}": Procs(pids=[s.pid]) for i, s in enumerate(local.servers)},
            "valkey": local.parts()["redis"],
            "postgres": local.parts()["postgres"],
            "load: sender": Procs(pids=[os.getpid()]),
            **{
                f"load: receivers {k + 1}": Procs(pids=[p.pid or 0])
                for k, (p, _) in enumerate(workers)
            },
        }
        res: dict[str, Any] = {
            "group_members": n,
            "gateways": gateways,
            "load_processes": 1 + clients,
            "sockets_held": held + 1,
            "setup_s": setup_s,
            "window": args.window,
        }
        phase = Phase(conv, n, args, sender_ws, procs, [pipe for _, pipe in workers], local.urls)
        res.update(await phase.run(None))
        if args.half_rate and res["messages_per_s"] > 0:
            res["half_rate"] = await phase.run(res["messages_per_s"] / 2)
        for _, pipe in workers:
            pipe.send(None)
        await sender_ws.close()
        return res
    finally:
        for proc, pipe in workers:
            pipe.close()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        local.stop()
        tmp.cleanup()


def report(res: dict[str, Any]) -> None:
    t = Table(
        title=f"im-server bench: fan-out in a {res['group_members']:,}-member group, "
        f"{res['gateways']} gateway(s), window {res['window']}, "
        f"{res['load_processes']} load processes (load {res['loadavg_1m'][0]})"
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("deliveries / s", f"{res['deliveries_per_s']:,.0f}"),
        ("messages / s", f"{res['messages_per_s']:,.1f}"),
        (
            "delivery p50 / p99 / p99.9",
            f"{res['delivery_p50_ms']:.1f} / {res['delivery_p99_ms']:.1f} / "
            f"{res['delivery_p999_ms']:.1f} ms",
        ),
        ("ack p50 / p99", f"{res['ack_p50_ms']:.1f} / {res['ack_p99_ms']:.1f} ms"),
        (
            "deliveries (expected) in",
            f"{res['deliveries']:,} ({res['deliveries_expected']:,}) in {res['wall_s']:.2f} s",
        ),
        ("lost / duplicated", f"{res['lost']} / {res['duplicated']}"),
        ("server CPU per delivery", f"{res['server_cpu_us_per_delivery']:.1f} µs"),
    ]
    rows[3:3] = [
        (f"  to members on {k}: p50 / p99", f"{p50:.1f} / {p99:.1f} ms")
        for k, (p50, p99) in res["delivery_p50_p99_ms_by_gateway"].items()
    ]
    for k, us in res["cpu_us_per_delivery_by_process"].items():
        share = res["cpu_share_of_a_core_by_process"][k]
        rows.append((f"  {k}", f"{us:.1f} µs ({share:.0%} of a core)"))
    if "half_rate" in res:
        h = res["half_rate"]
        rows.append(
            (
                "at half rate: delivery p50 / p99 / p99.9",
                f"{h['delivery_p50_ms']:.1f} / {h['delivery_p99_ms']:.1f} / "
                f"{h['delivery_p999_ms']:.1f} ms ({h['messages_per_s']:,.1f} messages/s, "
                f"lost {h['lost']}, duplicated {h['duplicated']})",
            )
        )
    if res["errors"]:
        rows.append(("errors", "; ".join(res["errors"])[:200]))
    for row in rows:
        t.add_row(*row)
    Console().print(t)
