"""The phases of the load benchmark: pairs of users, a paced phase with its progress bar,
the server's histograms read back, the end-of-run checks (nothing lost, nothing twice)
and the drain of the stream."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from im_server.bench.load import Pacer, Stats, open_ws, receiver, sender, ws_url
from im_server.bench.stack import Local, Procs, console


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


def hist(text: str, name: str) -> list[tuple[float, float]]:
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

        conn = await asyncpg.connect(local.dsn)
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
