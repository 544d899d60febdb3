"""``im-server bench --workers N``: the one-to-one phase against ``serve --workers 1`` and
against ``serve --workers N`` (fresh stores each), and the scaling factor between them.

The load comes from ``--client-procs`` client processes (the pairs split between them,
their results merged), so that one Python client saturating its core shows up as such
instead of as a server limit: every process's CPU over the phase is reported as cores
used (client processes, each worker, Valkey, PostgreSQL).

Each run first times the bare echo from the same client processes. The ratio the
project's goal is set in is the whole stack's CPU per delivered message (the machine's
busy time, kernel included, less the load clients' own CPU) over the same figure per
echo round trip; at ``--workers 1`` and at the default (a worker per core). A second
pair of figures counts the clients' kernel time as the stack's: on loopback a sender's
system call also runs the receiving socket's TCP input, so the stack's true share lies
between the two."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from im_server.bench.load import Stats, percentile
from im_server.bench.phases import drain_time, make_pairs, run_phase, verify
from im_server.bench.stack import Local, console

Pair = tuple[str, str, str, int]


def _client(
    index: int,
    url: str,
    pairs: list[Pair],
    args: tuple[int, float, int],
    barrier: Barrier,
    out: Queue[tuple[Stats, float, float]],
    echo_url: str | None = None,
) -> None:
    """A client process: run the phase on its pairs once every process is connected (on
    the bare echo with ``echo_url``); hand back the stats and the CPU seconds this
    process used while the clock ran, in all and in user mode."""
    window, duration, size = args
    cpu0 = [os.times()]

    def ready() -> None:
        barrier.wait()
        cpu0[0] = os.times()

    async def go() -> Stats:
        st, _ = await run_phase(
            f"c{index}-",
            url,
            pairs,
            window,
            duration,
            size,
            None,
            ready=ready,
            progress=False,
            echo_url=echo_url,
        )
        return st

    try:
        import uvloop

        st = uvloop.run(go())
    except ImportError:
        st = asyncio.run(go())
    t0, t1 = cpu0[0], os.times()
    user = t1.user - t0.user
    out.put((st, user + t1.system - t0.system, user))


def merge(parts: list[Stats]) -> Stats:
    m = Stats()
    for s in parts:
        for k in ("sent", "acked", "refused", "delivered", "duplicates"):
            setattr(m, k, getattr(m, k) + getattr(s, k))
        m.ack_latency += s.ack_latency
        m.delivery_latency += s.delivery_latency
        m.acked_seqs.update(s.acked_seqs)
        m.delivered_seqs.update(s.delivered_seqs)
        m.errors += s.errors
    m.started = min(s.started for s in parts)
    m.stopped = max(s.stopped for s in parts)
    return m


def _cpu_of(pids: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _workers_of(local: Local) -> list[int]:
    """The serve parent, then its worker processes (none with one worker)."""
    root = local.servers[0].pid
    kids = [p.pid for p in psutil.Process(root).children() if "--worker-index" in p.cmdline()]
    return [root, *sorted(kids)]


def _machine_busy() -> float:
    """CPU seconds the whole machine spent on anything but idling, so far."""
    t = psutil.cpu_times()._asdict()
    return float(sum(t.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal")))


def _names(k: int) -> list[str]:
    return ["serve"] if k == 1 else ["parent", *(f"worker {i}" for i in range(k))]


async def _clients_phase(
    local: Local, pairs: list[Pair], args: Any, label: str, echo_url: str | None = None
) -> tuple[Stats, list[float], float, float, float]:
    """One timed phase from ``--client-procs`` client processes (on the bare echo with
    ``echo_url``): the merged stats, each client's CPU seconds, the clients' user-mode
    CPU seconds together, the wall seconds and the machine's busy CPU seconds over it."""
    n = max(1, args.client_procs)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    out: Queue[tuple[Stats, float, float]] = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(
                i,
                local.url,
                pairs[i::n],
                (args.window, args.duration, args.size),
                barrier,
                out,
                echo_url,
            ),
        )
        for i in range(n)
    ]
    for p in procs:
        p.start()
    await asyncio.to_thread(barrier.wait, 120)
    busy0 = _machine_busy()
    t0 = time.monotonic()
    with console.status(f"[bold]{label}, {n} client process(es)"):
        results = [await asyncio.to_thread(out.get, True, args.duration + 120) for _ in procs]
    wall = time.monotonic() - t0
    busy = _machine_busy() - busy0
    for p in procs:
        p.join(30)
    return (
        merge([r[0] for r in results]),
        [r[1] for r in results],
        sum(r[2] for r in results),
        wall,
        busy,
    )


async def one_run(k: int, args: Any) -> dict[str, Any]:
    """Fresh stores and ``serve --workers k``; the bare echo, then the one-to-one phase,
    from the client processes; throughput, latency, CPU of every part, and the whole
    stack's CPU per message (the machine's busy time less the load clients') against the
    echo's per round trip."""
    tmp = tempfile.TemporaryDirectory(prefix="im-bench-")
    console.print(f"starting the stores and im-server --workers {k} …")
    local = Local(Path(tmp.name), workers=k, partitions=args.partitions)
    try:
        if k > 1:  # every worker listening and known to the others
            deadline = time.monotonic() + 30
            while len(_workers_of(local)) < k + 1 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.5)
        pairs = await make_pairs(local.url, args.pairs)
        est, ecpu, euser, _, ebusy = await _clients_phase(
            local, pairs, args, "bare echo", echo_url=f"ws://127.0.0.1:{local.echo_port}/"
        )
        echo_stack_us = max(0.0, ebusy - sum(ecpu)) / max(1, est.acked) * 1e6
        echo_with_kernel_us = max(0.0, ebusy - euser) / max(1, est.acked) * 1e6
        server_pids = _workers_of(local)
        parts = local.parts()
        parts0 = {name: v.cpu() for name, v in parts.items()}
        w0 = _cpu_of(server_pids)
        st, ccpu, cuser, wall, busy = await _clients_phase(local, pairs, args, f"im, {k} worker(s)")
        w1 = _cpu_of(server_pids)
        parts1 = {name: v.cpu() for name, v in parts.items()}
        _, drained_s = await drain_time(local)  # the persister catches up before the check
        lost, dup = await verify(local, local.url, st, {})
        cores = {name: (parts1[name] - parts0[name]) / wall for name in parts0}
        cores["client"] = sum(ccpu) / wall
        cores["rest of the machine"] = max(0.0, busy / wall - sum(cores.values()))
        server_cpu = sum(parts1[x] - parts0[x] for x in parts0)
        stack_us = max(0.0, busy - sum(ccpu)) / max(1, st.delivered) * 1e6
        with_kernel_us = max(0.0, busy - cuser) / max(1, st.delivered) * 1e6
        return {
            "workers": k,
            "client_procs": len(ccpu),
            "messages_acked_per_s": st.acked / st.seconds,
            "messages_delivered_per_s": st.delivered / st.seconds,
            "ack_p50_ms": percentile(st.ack_latency, 50) * 1000,
            "ack_p99_ms": percentile(st.ack_latency, 99) * 1000,
            "delivery_p99_ms": percentile(st.delivery_latency, 99) * 1000,
            "server_cpu_us_per_message": server_cpu / max(1, st.delivered) * 1e6,
            "stack_cpu_us_per_message": stack_us,
            "echo_round_trips_per_s": est.acked / est.seconds,
            "echo_stack_cpu_us_per_round_trip": echo_stack_us,
            "stack_ratio_to_echo": stack_us / echo_stack_us if echo_stack_us else float("nan"),
            # the same, with the clients' kernel time counted as the stack's (on loopback
            # a sender's system call also runs the receiving socket's TCP input, so the
            # truth lies between the two ratios)
            "stack_with_client_kernel_us_per_message": with_kernel_us,
            "echo_with_client_kernel_us_per_round_trip": echo_with_kernel_us,
            "stack_with_client_kernel_ratio_to_echo": (
                with_kernel_us / echo_with_kernel_us if echo_with_kernel_us else float("nan")
            ),
            "cores_used": cores,
            "cores_per_server_process": {
                name: (w1.get(pid, 0.0) - w0.get(pid, 0.0)) / wall
                for name, pid in zip(_names(k), server_pids, strict=False)
            },
            "client_cores_each": [c / wall for c in ccpu],
            "stream_drained_in_s": drained_s,
            "lost": lost,
            "duplicated": dup,
            "errors": st.errors[:5],
        }
    finally:
        local.stop()
        tmp.cleanup()


async def compare(args: Any) -> dict[str, Any]:
    one = await one_run(1, args)
    many = await one_run(args.workers, args)
    return {
        "pairs": args.pairs,
        "window": args.window,
        "duration_s": args.duration,
        "cores": psutil.cpu_count(),
        "runs": [one, many],
        "scaling": many["messages_delivered_per_s"] / max(1e-9, one["messages_delivered_per_s"]),
    }


def report(res: dict[str, Any]) -> None:
    runs = res["runs"]
    t = Table(
        title=f"im-server bench --workers: {res['pairs']} pairs × window {res['window']}, "
        f"{res['duration_s']} s, {res['cores']} cores on the machine"
    )
    t.add_column("figure")
    for r in runs:
        t.add_column(f"{r['workers']} worker(s)", justify="right")

    def row(label: str, fmt: Any) -> None:
        t.add_row(label, *(fmt(r) for r in runs))

    row("messages / s (acked)", lambda r: f"{r['messages_acked_per_s']:,.0f}")
    row("messages / s (delivered)", lambda r: f"{r['messages_delivered_per_s']:,.0f}")
    row("ack p50 / p99", lambda r: f"{r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f} ms")
    row("delivery p99", lambda r: f"{r['delivery_p99_ms']:.1f} ms")
    row("server CPU per message", lambda r: f"{r['server_cpu_us_per_message']:.0f} µs")
    row(
        "whole stack per message / echo's per round trip",
        lambda r: (
            f"{r['stack_cpu_us_per_message']:.0f} / {r['echo_stack_cpu_us_per_round_trip']:.0f} µs"
        ),
    )
    row("  ratio to the echo", lambda r: f"{r['stack_ratio_to_echo']:.2f}×")
    row(
        "  the same with the clients' kernel time",
        lambda r: (
            f"{r['stack_with_client_kernel_us_per_message']:.0f} / "
            f"{r['echo_with_client_kernel_us_per_round_trip']:.0f} µs = "
            f"{r['stack_with_client_kernel_ratio_to_echo']:.2f}×"
        ),
    )
    for part in ("gateway", "redis", "postgres", "client", "rest of the machine"):
        row(f"cores used: {part}", lambda r, p=part: f"{r['cores_used'][p]:.2f}")
    row(
        "  per server process",
        lambda r: " / ".join(f"{v:.2f}" for v in r["cores_per_server_process"].values()),
    )
    row("  per client process", lambda r: " / ".join(f"{v:.2f}" for v in r["client_cores_each"]))
    row("lost / duplicated", lambda r: f"{r['lost']} / {r['duplicated']}")
    Console().print(t)
    Console().print(
        f"scaling factor (delivered/s, {runs[1]['workers']} vs 1): {res['scaling']:.2f}×"
    )
