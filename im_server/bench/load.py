"""The load itself: senders with a window of sends in flight, receivers that time each
delivery. Written straight on ``websockets`` + orjson (no per-frame objects) so that the
client, which shares the machine, costs as little as it can."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect


@dataclass
class Stats:
    sent: int = 0
    acked: int = 0
    refused: int = 0
    delivered: int = 0
    duplicates: int = 0
    ack_latency: list[float] = field(default_factory=list)
    delivery_latency: list[float] = field(default_factory=list)
    acked_seqs: dict[str, set[int]] = field(default_factory=dict)
    delivered_seqs: dict[str, set[int]] = field(default_factory=dict)
    started: float = 0.0
    stopped: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(1e-9, self.stopped - self.started)


def ws_url(base: str, token: str | None) -> str:
    u = base.replace("http://", "ws://").replace("https://", "wss://")
    return f"{u}/v1/ws?token={token}" if token else u


async def open_ws(url: str) -> ClientConnection:
    return await connect(url, max_size=2**20, compression=None, open_timeout=30, ping_interval=None)


class Pacer:
    """Spreads sends evenly to reach ``rate`` per second in total (None: as fast as the
    window allows)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next > now:
            await asyncio.sleep(self.next - now)
        self.next = max(self.next, now) + self.interval


def _payload(size: int) -> str:
    return "x" * max(1, size)


async def sender(
    ws: ClientConnection,
    conv_id: str,
    tag: str,
    window: int,
    size: int,
    stats: Stats,
    stop: asyncio.Event,
    pacer: Pacer,
    echo: bool = False,
) -> None:
    """Keep ``window`` sends in flight until ``stop``; then wait for the last acks."""
    inflight: dict[str, float] = {}
    slots = asyncio.Semaphore(window)
    pad = _payload(size)
    done = asyncio.Event()

    async def reader() -> None:
        try:
            async for raw in ws:
                f = orjson.loads(raw)
                if echo:
                    cmid = f["client_msg_id"]
                elif f.get("type") == "ack":
                    cmid = f["client_msg_id"]
                else:
                    continue
                t0 = inflight.pop(cmid, None)
                if t0 is None:
                    continue
                stats.ack_latency.append(time.perf_counter() - t0)
                if echo or f.get("ok"):
                    stats.acked += 1
                    if not echo:
                        stats.acked_seqs.setdefault(f["conv_id"], set()).add(f["seq"])
                else:
                    stats.refused += 1
                slots.release()
                if stop.is_set() and not inflight:
                    done.set()
        except Exception as e:  # noqa: BLE001 - the run reports it
            stats.errors.append(repr(e))
        done.set()

    rt = asyncio.create_task(reader())
    i = 0
    while not stop.is_set():
        await slots.acquire()
        if stop.is_set():
            break
        await pacer.wait()
        cmid = f"{tag}-{i}"
        i += 1
        frame = orjson.dumps(
            {
                "type": "send",
                "client_msg_id": cmid,
                "conv_id": conv_id,
                "content_type": "text",
                "content": {"text": pad, "t": time.time()},
            }
        )
        inflight[cmid] = time.perf_counter()
        stats.sent += 1
        await ws.send(frame.decode())
    if inflight:
        try:
            await asyncio.wait_for(done.wait(), 10)
        except TimeoutError:
            stats.errors.append(f"{len(inflight)} acks missing on {tag}")
    rt.cancel()


async def receiver(
    ws: ClientConnection,
    stats: Stats,
    on_frame: Callable[[dict[str, Any]], None] | None = None,
    who: str = "",
) -> None:
    """Count deliveries; ``who`` tells receivers apart when several get the same
    conversation (a group), so that a copy to each is not taken for a duplicate."""
    try:
        async for raw in ws:
            f = orjson.loads(raw)
            if f.get("type") != "message":
                if on_frame:
                    on_frame(f)
                continue
            m = f["message"]
            got = stats.delivered_seqs.setdefault(who + m["conv_id"], set())
            if m["seq"] in got:
                stats.duplicates += 1
                continue
            got.add(m["seq"])
            stats.delivered += 1
            t = m["content"].get("t") if isinstance(m.get("content"), dict) else None
            if t:
                stats.delivery_latency.append(time.time() - t)
    except Exception as e:  # noqa: BLE001
        if "1000" not in repr(e) and "1001" not in repr(e):
            stats.errors.append(repr(e))


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]
