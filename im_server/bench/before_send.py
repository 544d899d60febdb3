"""What the before-send hook costs the send path.

    ./scripts/bench before_send [--senders 50] [--seconds 6] [--json]

One set of stores; the server is started once per variant, each with its own hook:
* off: no hook (the baseline);
* 1 ms: a hook (another process) answering ``allow`` after 1 ms;
* down: the hook's URL refuses connections (the circuit opens after 5 failures);
* hanging: the hook accepts and never answers (each call waits the 1 s timeout until
  the circuit opens; then one call per 10 s window).
Each variant: ``--senders`` WebSocket senders, each with one send in flight at a time,
for ``--seconds``; sends per second and ack latency p50 / p99, and the ratios to off.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from im_server.bench.cluster import ServerProcess, Stores
from im_server.bench.common import make_api_key, report
from im_server.bench.read_storm import pct
from im_server.bench.stack import BENCH_ENV
from im_server.client import Client, ServerClient
from im_server.runtime.processes import free_port, wait_for_port


async def _users(server: ServerProcess, key: str, n: int) -> list[tuple[Client, str]]:
    """``n`` senders, each with a friend to send to: (client, conv)."""
    run = uuid.uuid4().hex[:6]
    out: list[tuple[Client, str]] = []
    async with ServerClient(server.url, key) as app:
        ids = [f"s{run}-{i}" for i in range(2 * n)]
        await app.import_users([{"external_id": x} for x in ids])
        for i in range(n):
            conv = await app.befriend(ids[2 * i], ids[2 * i + 1])
            c = Client(server.url, (await app.mint_token(ids[2 * i]))["token"])
            await c.me()
            out.append((c, conv))
    return out


async def _load(server: ServerProcess, key: str, senders: int, seconds: float) -> dict[str, Any]:
    users = await _users(server, key, senders)
    socks = [await c.connect() for c, _ in users]
    lat: list[float] = []
    refused = 0
    stop = time.monotonic() + seconds

    async def loop(i: int) -> None:
        nonlocal refused
        conv = users[i][1]
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            ack = await socks[i].send(conv, {"text": "hi"})
            lat.append(time.perf_counter() - t0)
            refused += not ack.get("ok")

    t0 = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(senders)))
    took = time.monotonic() - t0
    for c, _ in users:
        await c.aclose()
    ms = [x * 1000 for x in lat]
    return {
        "sends_per_s": round(len(lat) / took, 1),
        "ack_p50_ms": round(pct(ms, 50), 2),
        "ack_p99_ms": round(pct(ms, 99), 2),
        "refused": refused,
    }


async def _variant(
    stores: Stores, server: ServerProcess, args: argparse.Namespace
) -> dict[str, Any]:
    key = await make_api_key(stores.pg.url, ["all"])
    return await _load(server, key, args.senders, args.seconds)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="im-before-send-"))
    stores = Stores.start(tmp / "stores")
    hook_port, hang_port, dead_port = free_port(), free_port(), free_port()
    hooks = [
        subprocess.Popen([sys.executable, "-m", "im_server.bench.hook_server", str(p), mode])
        for p, mode in ((hook_port, "1"), (hang_port, "hang"))
    ]
    variants = {
        "off": {},
        "1 ms": {"IM_BEFORE_SEND_URL": f"http://127.0.0.1:{hook_port}/hook"},
        "down": {"IM_BEFORE_SEND_URL": f"http://127.0.0.1:{dead_port}/hook"},
        "hanging": {"IM_BEFORE_SEND_URL": f"http://127.0.0.1:{hang_port}/hook"},
    }
    out: dict[str, Any] = {"senders": args.senders, "seconds": args.seconds, "variants": {}}
    try:
        for p in (hook_port, hang_port):
            wait_for_port("127.0.0.1", p, 30)
        for name, env in variants.items():
            server = ServerProcess(
                env={**stores.env(), **BENCH_ENV, "IM_TEST_LOG_DIR": str(tmp), **env}
            ).start()
            try:
                out["variants"][name] = asyncio.run(_variant(stores, server, args))
            finally:
                server.terminate()
    finally:
        for h in hooks:
            h.terminate()
        stores.stop()
    base = out["variants"]["off"]
    for v in out["variants"].values():
        v["throughput_ratio"] = round(v["sends_per_s"] / base["sends_per_s"], 2)
        v["p99_ratio"] = round(v["ack_p99_ms"] / base["ack_p99_ms"], 2)
    return out


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"before-send hook: {res['senders']} senders, {res['seconds']} s each")
    for col in ("hook", "sends/s", "ack p50 ms", "ack p99 ms", "throughput ratio", "p99 ratio"):
        t.add_column(col)
    for name, v in res["variants"].items():
        t.add_row(
            name,
            str(v["sends_per_s"]),
            str(v["ack_p50_ms"]),
            str(v["ack_p99_ms"]),
            f"{v['throughput_ratio']}x",
            f"{v['p99_ratio']}x",
        )
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench before_send", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--senders", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report(bench(args), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
