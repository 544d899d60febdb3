"""Member adds must not stall the server: concurrent "add these N users" calls to a big
group (all of them members already, as a client retrying or a script re-running would
send), while another user reads and writes, against a real ``im-server serve``.

    ./scripts/bench member_adds [--members 3000] [--storm 60] [--probes 40] [--json]

It starts its own PostgreSQL, Redis and server in a temp folder and stops them at the end.

Measured, in one run:
* baseline: the latency of another user's probes with no adds: a read
  (``GET /v1/conversations``) and a write that takes the sync-version lock every writer
  waits for (``POST /v1/conversations/{conv}/clear``);
* burst: ``--storm`` adds sent at once (each naming the ``--members`` users), with the
  probes running until the last add answers: the wall time of the burst and the probes'
  latency during it;
* flood: ``--storm`` clients re-adding in a closed loop with the per-user rate limit off
  (the worst case: the server's CPU is the limit), the probes' latency during it, and the
  adds per second;
* one call adding ``--members`` new users at once (the set-based statement), wall time;
* fresh burst: ``--fresh-storm`` adds sent at once, each naming the same ``--fresh-size``
  users to a group of its own where they were never members (so every add writes all its
  rows), with the probes running until the last add answers: what real adds cost
  everyone else.
The p99 ratios to the baseline are what the adds cost everyone else.

Setup (not measured): users and their sessions are inserted with SQL (as in the read-storm
benchmark), the group is created through the REST API.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

import asyncpg

from im_server.bench.cluster import ServerProcess, Stores
from im_server.bench.common import report, run_with_server
from im_server.bench.read_storm import make_users, pct
from im_server.client.transport import HttpPool

KINDS = ("read", "write", "settings")


async def _probe_loop(http: HttpPool, token: str, conv: str, n: int) -> dict[str, list[float]]:
    """``n`` reads and ``n`` each of two version-lock writes (a clear, a settings change),
    one after the other."""
    headers = {"Authorization": f"Bearer {token}"}
    out: dict[str, list[float]] = {k: [] for k in (*KINDS, "errors")}
    for i in range(n):
        for kind, method, path, body in (
            ("read", "GET", "/v1/conversations", None),
            ("write", "POST", f"/v1/conversations/{conv}/clear", None),
            ("settings", "PUT", f"/v1/conversations/{conv}/settings", {"pinned": i % 2 == 0}),
        ):
            t0 = time.perf_counter()
            r = await http.request(method, path, headers=headers, json=body)
            out[kind].append(time.perf_counter() - t0)
            if r.status_code >= 400:
                out["errors"].append(float(r.status_code))
    return out


async def _probe_until(
    http: HttpPool, token: str, conv: str, tasks: list[asyncio.Task[Any]]
) -> dict[str, list[float]]:
    """Probe rounds until every task is done."""
    out: dict[str, list[float]] = {k: [] for k in (*KINDS, "errors")}
    while not all(t.done() for t in tasks):
        one = await _probe_loop(http, token, conv, 1)
        for k in out:
            out[k] += one[k]
    return out


def _summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"p50_ms": round(pct(ms, 50), 1), "p99_ms": round(pct(ms, 99), 1)}


async def bench(stores: Stores, server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    pg = await asyncpg.connect(stores.pg.url.replace("postgresql+asyncpg", "postgresql"))
    run = uuid.uuid4().hex[:8]
    users = await make_users(pg, args.members * 2 + 2 + args.fresh_size, run)
    (_, owner_tok), (other, other_tok) = users[0], users[1]
    members = [u for u, _ in users[2 : 2 + args.members]]
    fresh = [u for u, _ in users[2 + args.members : 2 + 2 * args.members]]
    newcomers = [u for u, _ in users[2 + 2 * args.members :]]
    # idle connections are dropped before the server closes them (its keep-alive is 5 s):
    # a POST on a connection the server is closing would fail, and is not retried
    async with HttpPool(
        base_url=server.url, timeout=120, max_connections=args.storm + 8, keepalive=2.0
    ) as http:
        own = {"Authorization": f"Bearer {owner_tok}"}
        r = await http.post("/v1/groups", json={"name": "big", "member_ids": members}, headers=own)
        r.raise_for_status()
        gid = r.json()["group_id"]
        r = await http.post("/v1/friends/requests", json={"to_user_id": other}, headers=own)
        r.raise_for_status()
        rid = r.json()["request_id"]
        r = await http.post(
            f"/v1/friends/requests/{rid}/accept",
            headers={"Authorization": f"Bearer {other_tok}"},
        )
        conv = r.json()["conv_id"]

        await _probe_loop(http, other_tok, conv, 3)  # warm the token cache and the pools
        baseline = await _probe_loop(http, other_tok, conv, args.probes)

        add_path = f"/v1/groups/{gid}/members"
        add_body = {"user_ids": members}

        # burst: all at once, probes until the last one answers
        t0 = time.perf_counter()
        burst_tasks = [
            asyncio.create_task(http.post(add_path, json=add_body, headers=own))
            for _ in range(args.storm)
        ]
        burst_probe = await _probe_until(http, other_tok, conv, burst_tasks)
        burst_answers = await asyncio.gather(*burst_tasks)
        burst_wall = time.perf_counter() - t0
        burst_errors = sum(1 for a in burst_answers if a.status_code != 200)

        # flood: a closed loop per client
        stop = asyncio.Event()
        storm_lat: list[float] = []
        storm_errors: dict[int, int] = {}

        async def storm_client() -> None:
            while not stop.is_set():
                t1 = time.perf_counter()
                resp = await http.post(add_path, json=add_body, headers=own)
                storm_lat.append(time.perf_counter() - t1)
                if resp.status_code != 200:
                    storm_errors[resp.status_code] = storm_errors.get(resp.status_code, 0) + 1

        tasks = [asyncio.create_task(storm_client()) for _ in range(args.storm)]
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        during = await _probe_loop(http, other_tok, conv, args.probes)
        storm_wall = time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*tasks)

        t0 = time.perf_counter()
        r = await http.post(f"/v1/groups/{gid}/members", json={"user_ids": fresh}, headers=own)
        one_add_s = time.perf_counter() - t0
        r.raise_for_status()
        assert len(r.json()["added"]) == len(fresh)

        # fresh burst: every add writes all its rows, each in a group of its own
        small = []
        for i in range(args.fresh_storm):
            r = await http.post("/v1/groups", json={"name": f"g{i}", "member_ids": []}, headers=own)
            r.raise_for_status()
            small.append(r.json()["group_id"])
        t0 = time.perf_counter()
        fresh_tasks = [
            asyncio.create_task(
                http.post(f"/v1/groups/{g}/members", json={"user_ids": newcomers}, headers=own)
            )
            for g in small
        ]
        fresh_probe = await _probe_until(http, other_tok, conv, fresh_tasks)
        fresh_answers = await asyncio.gather(*fresh_tasks)
        fresh_wall = time.perf_counter() - t0
        fresh_errors = sum(1 for a in fresh_answers if a.status_code != 200)
        assert fresh_errors or all(
            len(a.json()["added"]) == args.fresh_size for a in fresh_answers
        ), "a fresh add did not add all its users"
    await pg.close()

    def ratio(phase: dict[str, list[float]], kind: str) -> float:
        b = pct(baseline[kind], 99)
        return round(pct(phase[kind], 99) / b, 1) if b else float("nan")

    return {
        "members": args.members,
        "storm_clients": args.storm,
        "phases": {
            name: {
                **{k: _summary(ph[k]) for k in KINDS},
                "p99_ratio": {k: ratio(ph, k) for k in KINDS},
                "probe_errors": len(ph["errors"]),
            }
            for name, ph in (
                ("baseline", baseline),
                ("burst", burst_probe),
                ("flood", during),
                ("fresh burst", fresh_probe),
            )
        },
        "fresh_adds": f"{args.fresh_storm} groups x {args.fresh_size} new members",
        "fresh_burst_wall_s": round(fresh_wall, 3),
        "fresh_add_errors": fresh_errors,
        "burst_wall_s": round(burst_wall, 3),
        "burst_add_errors": burst_errors,
        "flood_adds_per_s": round(len(storm_lat) / max(storm_wall, 1e-9), 1),
        "flood_add": _summary(storm_lat),
        "flood_add_errors": storm_errors,
        f"one_add_of_{len(fresh)}_new_s": round(one_add_s, 3),
    }


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"member adds: {res['storm_clients']} clients x {res['members']} users")
    cols = ("phase", "read p50/p99 ms", "clear p50/p99 ms", "settings p50/p99 ms")
    for col in (*cols, "p99 ratio read/clear/settings"):
        t.add_column(col)
    for name, ph in res["phases"].items():
        t.add_row(
            name,
            *(f"{ph[k]['p50_ms']} / {ph[k]['p99_ms']}" for k in KINDS),
            " / ".join(str(ph["p99_ratio"][k]) for k in KINDS),
        )
    Console().print(t)
    Console().print({k: v for k, v in res.items() if k != "phases"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench member_adds", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--members", type=int, default=3000, help="users in the group")
    ap.add_argument("--storm", type=int, default=60, help="concurrent re-adding clients")
    ap.add_argument("--probes", type=int, default=40, help="reads and writes per phase")
    ap.add_argument(
        "--fresh-storm", type=int, default=60, help="concurrent adds of new users (last phase)"
    )
    ap.add_argument("--fresh-size", type=int, default=2000, help="new users per such add")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run_with_server("im-member-adds-", lambda st, srv: bench(st, srv, args))
    report(res, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
