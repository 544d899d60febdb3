"""Read storm in a big group: every member reports "read up to the last seq" within
about one second, against a real ``im-server serve`` (REST, optionally a share over
WebSocket), compared in the same run with the naive way (one UPDATE per report, each in
its own transaction, straight from asyncpg).

    ./scripts/bench read_storm [--members 2000] [--ws-share 0.1] [--json]

It starts its own PostgreSQL and Redis (embedded, in a temp folder; fsync ON unless
``--no-fsync``, since commits are what is being counted) and a server child process,
and stops them all at the end, also on error or Ctrl-C.

Setup (not measured): users and sessions are inserted with SQL (a token's row is
sha256(token), as the server stores it), the group is created through the REST API by
its owner (so the server's permission cache is never stale), and the owner sends a few
messages over its WebSocket. Every member then makes one authenticated call, which warms
the server's token cache and the HTTP connection pool, so the storm measures the read
path and not token lookups.

Measured:
* wall time from the first report to the last durable answer, p50/p99 per report;
* what it cost PostgreSQL: the server's ``im_read_flushes_total`` and
  ``im_read_flush_rows_total`` deltas (statements ~ flushes x 2: the sync-version row
  and one multi-row cursor UPDATE), write transactions (xids assigned, exact), and
  ``xact_commit`` / ``xact_rollback`` deltas of ``pg_stat_database`` (read after the
  stats settle: idle backends report them within ~10 s);
* ``receipt`` frames the owner's WebSocket got during the storm and 2 s after;
* correctness: every reporter's read_seq is the last seq (SQL), and the owner's
  ``GET .../messages/{seq}/receipts`` says read_count == member_count == members - 1.

Baseline: a second group with the same members and messages; the same reports, with the
same concurrency and schedule, each one ``UPDATE conv_members SET read_seq = GREATEST(..)``
in its own transaction over an asyncpg pool as large as the server's (20 connections by
default). It skips HTTP, auth and the sync-version bump, so its time is a lower bound of
a real per-report server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
import psutil

from im_server.bench.cluster import ServerProcess, Stores, pg_dsn
from im_server.bench.common import report, run_with_server
from im_server.client import Client, Connection
from im_server.client.transport import HttpPool

# --------------------------------------------------------------------------- helpers


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


async def read_counters(http: HttpPool, url: str) -> dict[str, float]:
    r = await http.get(url + "/metrics")
    r.raise_for_status()
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        if line.startswith(("im_read_flushes_total ", "im_read_flush_rows_total ")):
            name, value = line.split()
            out[name] = float(value)
    return out


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


@dataclass
class PgStats:
    xact_commit: int
    xact_rollback: int
    next_xid: int


async def pg_stats(conn: asyncpg.Connection) -> PgStats:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await conn.fetchrow(
        "SELECT xact_commit, xact_rollback, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS nx "
        "FROM pg_stat_database WHERE datname = current_database()"
    )
    assert row is not None
    return PgStats(int(row["xact_commit"]), int(row["xact_rollback"]), int(row["nx"]))


@dataclass
class Phase:
    name: str
    reports: int = 0
    errors: int = 0
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statements: float = 0.0  # statements it cost, by the phase's own accounting
    write_xacts: int = 0
    xact_commit: int = 0
    xact_rollback: int = 0
    figures: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ms = [x * 1000 for x in self.latencies]
        return {
            "reports": self.reports,
            "errors": self.errors,
            "wall_s": round(self.wall, 3),
            "p50_ms": round(pct(ms, 50), 1),
            "p99_ms": round(pct(ms, 99), 1),
            "max_ms": round(max(ms), 1) if ms else None,
            "statements": self.statements,
            "statements_per_report": round(self.statements / self.reports, 4)
            if self.reports
            else None,
            "write_xacts": self.write_xacts,
            "xact_commit_delta": self.xact_commit,
            "xact_rollback_delta": self.xact_rollback,
            **self.figures,
        }


# --------------------------------------------------------------------------- setup


async def make_users(pg: asyncpg.Connection, n: int, run: str) -> list[tuple[int, str]]:
    """n users with one session each; the token is ``<run>-<user_id>`` and its row holds
    sha256(token) like ``im_server.services.accounts.token_hash``."""
    now = int(time.time() * 1000)
    rows = await pg.fetch(
        "INSERT INTO users (username, username_key, display_name, password_hash, created_at) "
        "SELECT $1 || i, lower($1 || i), $1 || i, 'bench-no-login', $2 "
        "FROM generate_series(1, $3) i "
        "RETURNING user_id",
        f"rs{run}_",
        now,
        n,
    )
    ids = sorted(int(r["user_id"]) for r in rows)
    await pg.execute(
        "INSERT INTO sessions (token_hash, user_id, device_id, created_at, last_used_at) "
        "SELECT sha256(convert_to($1 || '-' || u, 'UTF8')), u, 'bench', $2, $2 "
        "FROM unnest($3::bigint[]) u",
        run,
        now,
        ids,
    )
    return [(u, f"{run}-{u}") for u in ids]


async def wait_persisted(
    pg: asyncpg.Connection, conv_id: str, seq: int, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = await pg.fetchval("SELECT max_seq FROM conversations WHERE conv_id = $1", conv_id)
        if v is not None and int(v) >= seq:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{conv_id} not persisted up to {seq}")


# --------------------------------------------------------------------------- phases


async def run_scheduled(
    reporters: list[Any], spread: float, concurrency: int, report: Any
) -> tuple[float, list[float], int]:
    """Start report(r, slot) for every reporter at an even pace over ``spread`` seconds, at
    most ``concurrency`` in flight (``slot`` in 0..concurrency-1 is free while the report
    runs: one HTTP connection each). Returns (wall from first start to last answer,
    latencies, errors). A latency runs from the request leaving to its durable answer."""
    slots: asyncio.Queue[int] = asyncio.Queue()
    for i in range(concurrency):
        slots.put_nowait(i)
    lat: list[float] = []
    errors = 0
    first: list[float] = []
    last = 0.0
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    n = len(reporters)

    async def one(i: int, r: Any) -> None:
        nonlocal errors, last
        delay = t0 + spread * i / max(1, n) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        slot = await slots.get()
        try:
            t = time.perf_counter()
            if not first:
                first.append(t)
            try:
                await report(r, slot)
            except Exception as e:  # noqa: BLE001 - counted, shown below
                errors += 1
                if errors <= 3:
                    print(f"  report failed: {e!r}", file=sys.stderr)
                return
            end = time.perf_counter()
            lat.append(end - t)
            last = max(last, end)
        finally:
            slots.put_nowait(slot)

    await asyncio.gather(*(one(i, r) for i, r in enumerate(reporters)))
    return (last - first[0]) if first and last else float("nan"), lat, errors


def http_pools(n: int) -> list[HttpPool]:
    """n clients of one keep-alive connection each. One pool of 200 connections
    spends its time matching queued requests to connections (measured here: ~120 req/s
    against an empty ASGI app, ~1,000 req/s with one connection per client), so the
    storm would measure the client's pool instead of the server."""
    return [HttpPool(timeout=60.0, connect_timeout=10.0, max_connections=1) for _ in range(n)]


async def server_storm(
    args: argparse.Namespace,
    url: str,
    pg: asyncpg.Connection,
    http: HttpPool,
    owner: Client,
    owner_ws: Connection,
    conv: str,
    last_seq: int,
    members: list[tuple[int, str]],
    server_pid: int,
) -> Phase:
    phase = Phase("server (group commit)")
    reporters = members[:]
    random.Random(1).shuffle(reporters)
    n_ws = int(round(len(reporters) * args.ws_share))
    ws_users = set(u for u, _ in reporters[:n_ws])

    clients: list[Client] = []
    pools = http_pools(args.concurrency)
    try:
        # WebSocket share: a reporting socket, and a second socket of the same user that hears
        # the ``read`` push once the cursor is durable (the reporting one is left out of it).
        ws_pairs: dict[int, tuple[Connection, asyncio.Future[float]]] = {}
        if n_ws:
            loop = asyncio.get_running_loop()

            async def open_pair(uid: int, token: str) -> None:
                c = Client(url, token, user_id=uid, http=http)
                clients.append(c)
                fut: asyncio.Future[float] = loop.create_future()

                def on_event(f: dict[str, Any]) -> None:
                    if (
                        f.get("type") == "read"
                        and f.get("conv_id") == conv
                        and int(f.get("seq", 0)) >= last_seq
                        and not fut.done()
                    ):
                        fut.set_result(time.perf_counter())

                reporter = await c.connect(queue_events=False)
                await c.connect(queue_events=False, on_event=on_event)
                ws_pairs[uid] = (reporter, fut)

            sem = asyncio.Semaphore(50)

            async def guarded(uid: int, token: str) -> None:
                async with sem:
                    await open_pair(uid, token)

            await asyncio.gather(*(guarded(u, t) for u, t in reporters if u in ws_users))

        headers = {u: {"Authorization": f"Bearer {t}"} for u, t in reporters}
        path = f"{url}/v1/conversations/{conv}/read"
        body = orjson.dumps({"seq": last_seq})

        # warm the server's token cache and the HTTP pools (one call per REST reporter)

        async def warm(r: tuple[int, str], slot: int) -> None:
            for attempt in range(5):
                resp = await pools[slot].get(url + "/v1/blocks", headers=headers[r[0]])
                if resp.status_code != 503 or attempt == 4:
                    resp.raise_for_status()
                    return
                await asyncio.sleep(0.2)

        _, _, warm_errors = await run_scheduled(
            [r for r in reporters if r[0] not in ws_users], 2.0, args.concurrency, warm
        )
        if warm_errors:
            raise RuntimeError(f"{warm_errors} warm-up calls failed")

        await asyncio.sleep(args.settle)  # let pg_stat_database settle before the snapshot
        c0 = await read_counters(http, url)
        s0 = await pg_stats(pg)

        receipts: list[dict[str, Any]] = []
        owner_ws.on_event(
            lambda f: (
                receipts.append(f)
                if f.get("type") == "receipt" and f.get("conv_id") == conv
                else None
            )
        )

        async def report(r: tuple[int, str], slot: int) -> None:
            uid = r[0]
            if uid in ws_pairs:
                conn, fut = ws_pairs[uid]
                await conn.read(conv, last_seq)
                await asyncio.wait_for(asyncio.shield(fut), 30)
                return
            resp = await pools[slot].post(
                path, content=body, headers={**headers[uid], "Content-Type": "application/json"}
            )
            if resp.status_code != 200:
                raise RuntimeError(f"{resp.status_code} {resp.text[:200]}")
            if int(resp.json()["read_seq"]) != last_seq:
                raise RuntimeError(f"answer {resp.text[:200]}")

        cpu0 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
        t_start = time.monotonic()
        wall, lat, errors = await run_scheduled(reporters, args.spread, args.concurrency, report)
        storm_end = time.monotonic()
        cpu1 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
        await asyncio.sleep(2.0)
        receipts_in_window = len(receipts)
        c1 = await read_counters(http, url)
        # idle backends report their counters within ~10 s of their last report
        await asyncio.sleep(max(0.0, args.settle - (time.monotonic() - storm_end)))
        s1 = await pg_stats(pg)

        flushes = c1.get("im_read_flushes_total", 0) - c0.get("im_read_flushes_total", 0)
        rows = c1.get("im_read_flush_rows_total", 0) - c0.get("im_read_flush_rows_total", 0)
        phase.reports, phase.errors, phase.wall, phase.latencies = len(reporters), errors, wall, lat
        phase.statements = flushes * 2
        phase.write_xacts = s1.next_xid - s0.next_xid
        phase.xact_commit = s1.xact_commit - s0.xact_commit
        phase.xact_rollback = s1.xact_rollback - s0.xact_rollback
        phase.figures = {
            "rest_reports": len(reporters) - n_ws,
            "ws_reports": n_ws,
            "flushes": int(flushes),
            "flush_rows": int(rows),
            "rows_per_flush": round(rows / flushes, 1) if flushes else None,
            "receipt_pushes": receipts_in_window,
            "receipt_window_s": round(storm_end - t_start + 2.0, 2),
            "server_cpu_s": round(cpu1[0] - cpu0[0], 2),
            "client_cpu_s": round(cpu1[1] - cpu0[1], 2),
        }

        # correctness
        good, total = await pg.fetchrow(
            "SELECT count(*) FILTER (WHERE read_seq = $2), count(*) FROM conv_members "
            "WHERE conv_id = $1 AND user_id = ANY($3::bigint[])",
            conv,
            last_seq,
            [u for u, _ in reporters],
        )
        rc = await owner.receipts(conv, last_seq)
        phase.figures["check_cursors_at_last_seq"] = f"{good}/{total}"
        phase.figures["check_receipts"] = rc
        phase.figures["ok"] = bool(
            good == total == len(reporters)
            and rc["read_count"] == rc["member_count"] == len(reporters)
            and errors == 0
        )
        return phase
    finally:
        for c in clients:
            await c.aclose()
        for h in pools:
            await h.aclose()


async def naive_storm(
    args: argparse.Namespace,
    stores: Stores,
    pg: asyncpg.Connection,
    conv: str,
    last_seq: int,
    members: list[tuple[int, str]],
) -> Phase:
    phase = Phase("naive (UPDATE per report)")
    reporters = members[:]
    random.Random(1).shuffle(reporters)

    async def no_reset(_conn: asyncpg.Connection) -> None:
        pass  # asyncpg's default release query (RESET ALL...) would add a transaction

    pool = await asyncpg.create_pool(
        pg_dsn(stores), min_size=args.naive_pool, max_size=args.naive_pool, reset=no_reset
    )
    assert pool is not None
    s0 = await pg_stats(pg)

    async def report(r: tuple[int, str], _slot: int) -> None:
        async with pool.acquire() as c:
            await c.execute(
                "UPDATE conv_members SET read_seq = GREATEST(COALESCE(read_seq, 0), $3) "
                "WHERE conv_id = $1 AND user_id = $2",
                conv,
                r[0],
                last_seq,
            )

    wall, lat, errors = await run_scheduled(reporters, args.spread, args.concurrency, report)
    await pool.close()  # a backend that exits reports its counters at once
    await asyncio.sleep(0.5)
    s1 = await pg_stats(pg)
    phase.reports, phase.errors, phase.wall, phase.latencies = len(reporters), errors, wall, lat
    phase.statements = len(reporters) - errors
    phase.write_xacts = s1.next_xid - s0.next_xid
    phase.xact_commit = s1.xact_commit - s0.xact_commit
    phase.xact_rollback = s1.xact_rollback - s0.xact_rollback
    good, total = await pg.fetchrow(
        "SELECT count(*) FILTER (WHERE read_seq = $2), count(*) FROM conv_members "
        "WHERE conv_id = $1 AND user_id = ANY($3::bigint[])",
        conv,
        last_seq,
        [u for u, _ in reporters],
    )
    phase.figures = {
        "pool": args.naive_pool,
        "check_cursors_at_last_seq": f"{good}/{total}",
        "ok": bool(good == total == len(reporters) and errors == 0),
    }
    return phase


# --------------------------------------------------------------------------- main


async def bench(args: argparse.Namespace, stores: Stores, server: ServerProcess) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)
    url = server.url
    run = uuid.uuid4().hex[:8]
    pg = await asyncpg.connect(pg_dsn(stores))
    http = HttpPool(timeout=60.0, connect_timeout=10.0)
    try:
        t_setup = time.monotonic()
        users = await make_users(pg, args.members, run)
        (owner_id, owner_token), members = users[0], users[1:]
        owner = Client(url, owner_token, user_id=owner_id, http=http)
        ids = [u for u, _ in members]
        conv_a = (await owner.create_group("read storm", ids))["conv_id"]
        conv_b = (await owner.create_group("read storm baseline", ids))["conv_id"]
        owner_ws = await owner.connect(queue_events=False)
        last = {conv_a: 0, conv_b: 0}
        for conv in (conv_a, conv_b):
            for i in range(args.messages):
                ack = await owner_ws.send(conv, f"message {i} for everyone")
                assert ack.get("ok"), ack
                last[conv] = int(ack["seq"])
            await wait_persisted(pg, conv, last[conv])
        setup_s = time.monotonic() - t_setup
        if not args.json:
            print(
                f"setup: {args.members} members, groups {conv_a} and {conv_b}, "
                f"{args.messages} messages each, {setup_s:.1f} s",
                file=sys.stderr,
            )

        assert server.proc is not None
        srv = await server_storm(
            args, url, pg, http, owner, owner_ws, conv_a, last[conv_a], members, server.proc.pid
        )
        naive = await naive_storm(args, stores, pg, conv_b, last[conv_b], members)
        await owner.aclose()
    finally:
        await http.aclose()
        await pg.close()

    s, b = srv.summary(), naive.summary()
    ratios = {
        "statements_per_report_naive_over_server": round(
            b["statements_per_report"] / s["statements_per_report"], 1
        )
        if s["statements_per_report"]
        else None,
        "write_xacts_naive_over_server": round(b["write_xacts"] / s["write_xacts"], 1)
        if s["write_xacts"]
        else None,
        "wall_server_over_naive": round(s["wall_s"] / b["wall_s"], 2) if b["wall_s"] else None,
        "p99_server_over_naive": round(s["p99_ms"] / b["p99_ms"], 2) if b["p99_ms"] else None,
    }
    return {
        "benchmark": "read_storm",
        "machine": {
            "cpus": os.cpu_count(),
            "note": "shared, noisy",
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "params": {
            "members": args.members,
            "reporters": len(members),
            "messages": args.messages,
            "spread_s": args.spread,
            "concurrency": args.concurrency,
            "ws_share": args.ws_share,
            "fsync": args.fsync,
            "naive_pool": args.naive_pool,
        },
        "server": s,
        "naive": b,
        "ratios": ratios,
    }


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s, b, r, p = res["server"], res["naive"], res["ratios"], res["params"]
    t = Table(
        title=f"Read storm: {p['reporters']} reporters in a {p['members']}-member group, "
        f"spread {p['spread_s']} s, concurrency {p['concurrency']}, "
        f"{res['machine']['cpus']} CPUs (shared, load {res['machine']['loadavg_1m_start']})"
    )
    t.add_column("")
    t.add_column("server (group commit)", justify="right")
    t.add_column("naive (UPDATE per report)", justify="right")
    rows = [
        ("reports (REST / WS)", f"{s['rest_reports']} / {s['ws_reports']}", f"{b['reports']} / -"),
        ("errors", s["errors"], b["errors"]),
        ("wall, first report -> last answer", f"{s['wall_s']:.2f} s", f"{b['wall_s']:.2f} s"),
        (
            "p50 / p99 per report",
            f"{s['p50_ms']} / {s['p99_ms']} ms",
            f"{b['p50_ms']} / {b['p99_ms']} ms",
        ),
        (
            "statements (flushes x 2 | 1 per report)",
            f"{s['statements']:.0f} ({s['flushes']} flushes, {s['rows_per_flush']} rows each)",
            f"{b['statements']:.0f}",
        ),
        ("statements per report", s["statements_per_report"], b["statements_per_report"]),
        ("write transactions (xids)", s["write_xacts"], b["write_xacts"]),
        (
            "xact_commit / xact_rollback delta",
            f"{s['xact_commit_delta']} / {s['xact_rollback_delta']}",
            f"{b['xact_commit_delta']} / {b['xact_rollback_delta']}",
        ),
        (
            "CPU during the storm: server / this client",
            f"{s['server_cpu_s']} s / {s['client_cpu_s']} s",
            "-",
        ),
        (
            "receipt pushes to the sender",
            f"{s['receipt_pushes']} in {s['receipt_window_s']} s",
            "-",
        ),
        ("cursors at last seq", s["check_cursors_at_last_seq"], b["check_cursors_at_last_seq"]),
        (
            "receipts (read/member)",
            f"{s['check_receipts']['read_count']}/{s['check_receipts']['member_count']}",
            "-",
        ),
        ("ok", s["ok"], b["ok"]),
    ]
    for row in rows:
        t.add_row(*(str(x) for x in row))
    console = Console()
    console.print(t)
    console.print(
        f"ratios: statements per report naive/server = {r['statements_per_report_naive_over_server']}x, "
        f"write transactions naive/server = {r['write_xacts_naive_over_server']}x, "
        f"wall server/naive = {r['wall_server_over_naive']}, p99 server/naive = {r['p99_server_over_naive']}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench read_storm", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--members", type=int, default=2000, help="group size, owner included")
    ap.add_argument("--messages", type=int, default=5, help="messages sent before the storm")
    ap.add_argument("--spread", type=float, default=1.0, help="seconds over which reports start")
    ap.add_argument("--concurrency", type=int, default=200, help="reports in flight at most")
    ap.add_argument(
        "--ws-share", type=float, default=0.0, help="share of reports sent as WS read frames"
    )
    ap.add_argument("--naive-pool", type=int, default=20, help="asyncpg pool of the baseline")
    ap.add_argument(
        "--settle", type=float, default=11.0, help="seconds for pg_stat_database to settle"
    )
    ap.add_argument("--no-fsync", dest="fsync", action="store_false", help="PostgreSQL fsync off")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.members < 2 or not 0 <= args.ws_share <= 1:
        ap.error("--members >= 2, 0 <= --ws-share <= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run_with_server(
        "im-read-storm-", lambda stores, server: bench(args, stores, server), fsync=args.fsync
    )
    report(res, args.json, print_table)
    return 0 if res["server"]["ok"] and res["naive"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
