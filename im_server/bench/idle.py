"""``im-server bench --idle N``: how many idle WebSockets one server process holds, what
each costs it in memory, and what holding them costs in CPU while nothing happens but the
keepalive pings.

Tens of thousands of sockets do not fit in one client process's file descriptors nor in
one loopback source address's ephemeral ports (about 28,000 each), so the client is
several worker processes, each opening its share concurrently in bounded batches from its
own source addresses (127.0.0.2, 127.0.0.3, …: Linux routes all of 127/8 to the loopback
interface). The server answers the pings; the workers' connections answer them back."""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import resource
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import psutil
from rich.progress import BarColumn, Progress, TextColumn

from im_server.client.transport import HttpPool

PER_WORKER = 12_500
"""Connections per client process: within a default hard limit of 20,000 descriptors,
and small enough for a process to open its share quickly."""
PER_ADDRESS = 20_000
"""Connections per loopback source address, below the ~28,000 ephemeral ports."""
OPENING = 128
"""Handshakes in flight per client process."""
SERVER_SPARE_FDS = 300
"""Descriptors the server process needs besides its WebSockets (store connections,
listening sockets, logs, its event loop)."""


def raise_nofile(need: int) -> int:
    """Raise this process's descriptor limit to ``need`` (the hard limit too, which only a
    privileged process may), or as far as the hard limit allows; returns the soft limit.
    Child processes inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return soft
    if hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return need
    if hard < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
            return need
        except (ValueError, OSError):
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def source_address(i: int) -> str:
    """The i-th loopback source address: 127.0.0.2, 127.0.0.3, … (127.0.0.1 is left to
    the server's other clients)."""
    return f"127.0.{(i + 2) // 256}.{(i + 2) % 256}"


async def _hold(
    pipe: Connection,
    urls: list[str],
    addresses: list[str],
    opened: Synchronized,  # type: ignore[type-arg]
    deflate: bool,
) -> None:
    """A worker's life: open every URL, report, then answer the parent's commands."""
    from websockets.asyncio.client import ClientConnection, connect
    from websockets.protocol import State

    conns: list[ClientConnection] = []
    errors: list[str] = []
    sem = asyncio.Semaphore(OPENING)

    async def one(i: int, url: str) -> None:
        async with sem:
            try:
                ws = await connect(
                    url,
                    compression="deflate" if deflate else None,
                    open_timeout=60,
                    ping_interval=None,  # the server pings; the client only answers
                    close_timeout=1,
                    proxy=None,
                    local_addr=(addresses[i % len(addresses)], 0),
                )
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e))
                return
            conns.append(ws)
            opened.value += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, u) for i, u in enumerate(urls)))
    pipe.send(("opened", len(conns), len(errors), errors[:3], time.perf_counter() - t0))
    loop = asyncio.get_running_loop()
    while True:
        cmd, arg = await loop.run_in_executor(None, pipe.recv)
        if cmd == "ping":  # a sample (evenly spread) answers an application ping
            alive = 0
            for ws in conns[:: max(1, len(conns) // max(1, arg))][:arg]:
                try:
                    await ws.send('{"type":"ping"}')
                    if "pong" in str(await asyncio.wait_for(ws.recv(), 10)):
                        alive += 1
                except Exception:  # noqa: BLE001 - counted as not answering
                    continue
            still_open = sum(1 for ws in conns if ws.protocol.state is State.OPEN)
            pipe.send(("pinged", alive, still_open))
        else:  # close: drop the sockets (the server sees them go)
            for ws in conns:
                ws.transport.abort()
            pipe.send(("closed", 0, 0))
            return


def _worker(
    pipe: Connection,
    urls: list[str],
    addresses: list[str],
    opened: Synchronized,  # type: ignore[type-arg]
    deflate: bool,
) -> None:
    raise_nofile(len(urls) + 256)
    coro = _hold(pipe, urls, addresses, opened, deflate)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


async def _gather(pipes: list[Connection]) -> list[tuple[Any, ...]]:
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(None, p.recv) for p in pipes)))


async def idle_connections(args: argparse.Namespace) -> dict[str, Any]:
    """Open ``args.idle`` WebSockets to one server process, hold them idle for
    ``args.idle_seconds`` (pings on), and report the server's memory and CPU for them."""
    from im_server.bench.load import ws_url
    from im_server.bench.stack import Local, console, register_many

    n = args.idle
    idle_s = float(getattr(args, "idle_seconds", 60.0))
    deflate = bool(getattr(args, "idle_deflate", False))
    raise_nofile(n + 4096)  # the server process inherits it
    tmp = tempfile.TemporaryDirectory(prefix="im-bench-")
    local = Local(Path(tmp.name))
    workers: list[Any] = []
    pipes: list[Connection] = []
    try:
        users = await register_many(local.url, max(1, n // 100), f"idle{uuid.uuid4().hex[:6]}")
        urls = [ws_url(local.url, users[i % len(users)].token) for i in range(n)]
        proc = psutil.Process(local.servers[0].pid)
        server_fds = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
        if server_fds < n + SERVER_SPARE_FDS:
            raise SystemExit(
                f"the server process may open {server_fds:,} descriptors and {n:,} sockets "
                f"need about {n + SERVER_SPARE_FDS:,}: raise the hard limit (ulimit -Hn; "
                "systemd LimitNOFILE=, docker run --ulimit nofile=) or ask for fewer"
            )
        rss0 = proc.memory_info().rss
        n_workers = max(1, math.ceil(n / PER_WORKER))
        n_addresses = max(n_workers, math.ceil(n / PER_ADDRESS))
        ctx = mp.get_context("spawn")
        counters = []
        t0 = time.perf_counter()
        for k in range(n_workers):
            share = urls[k::n_workers]
            addrs = [source_address(a) for a in range(n_addresses) if a % n_workers == k]
            parent, child = ctx.Pipe()
            counter = ctx.Value("i", 0, lock=False)
            worker = ctx.Process(target=_worker, args=(child, share, addrs, counter, deflate))
            worker.start()
            workers.append(worker)
            pipes.append(parent)
            counters.append(counter)
        with Progress(
            TextColumn("[bold]opening"),
            BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,}"),
            console=console,
            transient=True,
        ) as prog:
            task = prog.add_task("open", total=n)
            pending = asyncio.ensure_future(_gather(pipes))
            while not pending.done():
                await asyncio.sleep(0.2)
                prog.update(task, completed=sum(c.value for c in counters))
            reports = pending.result()
        open_s = time.perf_counter() - t0
        held_open = sum(r[1] for r in reports)
        failed = sum(r[2] for r in reports)
        for e in [e for r in reports for e in r[3]][:3]:
            console.print(f"[red]open failed: {e}")
        await asyncio.sleep(3)  # the last handshakes' work settles
        rss1 = proc.memory_info().rss
        async with HttpPool() as http:
            text = (await http.get(local.url + "/metrics")).text
        held = int(float(text.split("\nim_connections ")[1].split()[0]))
        gateway, everything = local.parts()["gateway"], local.im_procs()
        cpu_gw0, cpu_all0 = gateway.cpu(), everything.cpu()
        console.print(f"holding {held:,} connections idle for {idle_s:.0f} s …")
        await asyncio.sleep(idle_s)
        cpu_gw = gateway.cpu() - cpu_gw0
        cpu_all = everything.cpu() - cpu_all0
        rss2 = proc.memory_info().rss
        sample = 200
        for pipe in pipes:
            pipe.send(("ping", max(1, sample // len(pipes))))
        pinged = await _gather(pipes)
        alive = sum(r[1] for r in pinged)
        still_open = sum(r[2] for r in pinged)
        for pipe in pipes:
            pipe.send(("close", 0))
        await _gather(pipes)
        conn_hours = max(1, held_open) * idle_s / 3600
        return {
            "idle_connections": n,
            "opened_by_client": held_open,
            "failed_to_open": failed,
            "held_by_server": held,
            "open_after_idle": still_open,
            "sample_answering_ping": alive,
            "sample_size": sum(max(1, sample // len(pipes)) for _ in pipes),
            "client_processes": n_workers,
            "source_addresses": n_addresses,
            "server_nofile_limit": server_fds,
            "open_seconds": open_s,
            "opened_per_s": held_open / open_s,
            "server_rss_before_mib": rss0 / 2**20,
            "server_rss_after_mib": rss1 / 2**20,
            "server_rss_after_idle_mib": rss2 / 2**20,
            "kib_per_connection": (rss1 - rss0) / max(1, held_open) / 1024,
            "idle_seconds": idle_s,
            "gateway_cpu_s": cpu_gw,
            "gateway_cpu_ms_per_connection_hour": cpu_gw / conn_hours * 1000,
            "all_server_cpu_ms_per_connection_hour": cpu_all / conn_hours * 1000,
        }
    finally:
        for pipe in pipes:
            pipe.close()
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
        local.stop()
        tmp.cleanup()
