"""Presence must cost the server work linear in a user's friends, nothing more: one user
with F friends online connects and disconnects in a loop, against a real
``im-server serve``, for each F in ``--friends`` (default 10, 100, 1000).

    ./scripts/bench presence [--friends 10,100,1000] [--cycles 20] [--json]

It starts its own PostgreSQL, Redis and server in a temp folder and stops them at the end.

Measured, per F: the server process's CPU time (user + system, from /proc) per cycle of
one connect and one disconnect, where a cycle ends when every friend's socket got both
the online and the offline ``presence`` frame; and the wall time from the connect (the
close) until the last friend got the online (offline) frame. The server runs with no
offline grace and a 20 ms sweep, so every offline is announced at once.
Baseline, in the same run: the same cycles of a user without friends (a connect, a ping,
a close: what any connection costs). Reported: CPU per cycle, its ratio to the baseline,
and the CPU per friend (the slope between the two largest F says whether it is linear).

Setup (not measured): users, sessions and friendships are inserted with SQL, the friends'
sockets are opened before the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any
from urllib.parse import quote

import asyncpg
import orjson
from websockets.asyncio.client import ClientConnection, connect

from im_server.bench.cluster import ServerProcess, Stores
from im_server.bench.common import report, run_with_server
from im_server.bench.read_storm import make_users, pct

SERVER_ENV = {"IM_PRESENCE_OFFLINE_GRACE_SECONDS": "0", "IM_PRESENCE_SWEEP_SECONDS": "0.02"}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def ws_url(server: ServerProcess, token: str) -> str:
    return server.url.replace("http", "ws", 1) + "/v1/ws?token=" + quote(token)


class Watchers:
    """The friends' sockets: count the presence frames about the subject."""

    def __init__(self, subject: int) -> None:
        self.subject = subject
        self.seen = {True: 0, False: 0}
        self.last_at = {True: 0.0, False: 0.0}
        self.changed = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.socks: list[ClientConnection] = []

    async def open(self, server: ServerProcess, tokens: list[str]) -> None:
        for i in range(0, len(tokens), 100):
            socks = await asyncio.gather(
                *(connect(ws_url(server, t), max_size=1 << 20) for t in tokens[i : i + 100])
            )
            self.socks += socks
        self.tasks = [asyncio.create_task(self._read(s)) for s in self.socks]

    async def _read(self, sock: ClientConnection) -> None:
        async for raw in sock:
            f = orjson.loads(raw)
            if f.get("type") == "presence" and f.get("user_id") == self.subject:
                self.seen[f["online"]] += 1
                self.last_at[f["online"]] = time.perf_counter()
                self.changed.set()

    async def wait(self, online: bool, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.seen[online] < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*(s.close() for s in self.socks), return_exceptions=True)


async def run_cycles(
    server: ServerProcess, pid: int, token: str, watchers: Watchers | None, cycles: int
) -> dict[str, Any]:
    friends = len(watchers.socks) if watchers else 0
    online_ms: list[float] = []
    offline_ms: list[float] = []
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    for i in range(cycles):
        start = time.perf_counter()
        sock = await connect(ws_url(server, token))
        if watchers:
            await watchers.wait(True, friends * (i + 1))
            online_ms.append((watchers.last_at[True] - start) * 1000)
        else:
            await sock.send('{"type":"ping"}')
            await sock.recv()
        start = time.perf_counter()
        await sock.close()
        if watchers:
            await watchers.wait(False, friends * (i + 1))
            offline_ms.append((watchers.last_at[False] - start) * 1000)
        else:
            await asyncio.sleep(0.03)  # the server's side of the close (and a sweep tick)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    out: dict[str, Any] = {
        "friends": friends,
        "cpu_ms_per_cycle": round(cpu * 1000 / cycles, 2),
        "wall_ms_per_cycle": round(wall * 1000 / cycles, 1),
    }
    if online_ms:
        out["online_p50_ms"] = round(pct(online_ms, 50), 1)
        out["offline_p50_ms"] = round(pct(offline_ms, 50), 1)
    return out


async def bench(stores: Stores, server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    assert server.proc is not None
    pid = server.proc.pid
    sizes = sorted(int(x) for x in args.friends.split(","))
    pg = await asyncpg.connect(stores.pg.url.replace("postgresql+asyncpg", "postgresql"))
    run = uuid.uuid4().hex[:8]
    users = await make_users(pg, 1 + len(sizes) + sum(sizes), run)
    loner_tok = users[0][1]
    rows: list[dict[str, Any]] = []
    baseline = await run_cycles(server, pid, loner_tok, None, args.cycles)
    rest = users[1:]
    for f in sizes:
        (subject, subject_tok), friends, rest = rest[0], rest[1 : 1 + f], rest[1 + f :]
        now = int(time.time() * 1000)
        await pg.executemany(
            "INSERT INTO friendships (user_a, user_b, created_at) VALUES ($1, $2, $3)",
            [(min(subject, u), max(subject, u), now) for u, _ in friends],
        )
        watchers = Watchers(subject)
        await watchers.open(server, [t for _, t in friends])
        try:
            await run_cycles(server, pid, subject_tok, watchers, 2)  # warm up
            watchers.seen = {True: 0, False: 0}
            rows.append(await run_cycles(server, pid, subject_tok, watchers, args.cycles))
        finally:
            await watchers.close()
    await pg.close()
    base = baseline["cpu_ms_per_cycle"]
    for r in rows:
        r["ratio_to_baseline"] = round(r["cpu_ms_per_cycle"] / base, 1) if base else None
        extra = r["cpu_ms_per_cycle"] - base
        r["cpu_us_per_friend"] = round(extra * 1000 / r["friends"], 1)
    return {"cycles": args.cycles, "baseline": baseline, "rows": rows}


def print_table(res: dict[str, Any]) -> None:
    b = res["baseline"]
    print(f"{res['cycles']} connect+disconnect cycles per row; server CPU from /proc")
    print(f"baseline (no friends): {b['cpu_ms_per_cycle']} ms CPU per cycle")
    print(
        f"{'friends':>8} {'CPU ms/cycle':>13} {'ratio':>6} {'µs/friend':>10} "
        f"{'online p50':>11} {'offline p50':>12}"
    )
    for r in res["rows"]:
        print(
            f"{r['friends']:>8} {r['cpu_ms_per_cycle']:>13} {r['ratio_to_baseline']:>6} "
            f"{r['cpu_us_per_friend']:>10} {r['online_p50_ms']:>9} ms {r['offline_p50_ms']:>9} ms"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench presence", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--friends", default="10,100,1000", help="comma-separated friend counts")
    ap.add_argument("--cycles", type=int, default=20, help="connect+disconnect cycles per row")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run_with_server("im-presence-", lambda st, srv: bench(st, srv, args), env=SERVER_ENV)
    report(res, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
