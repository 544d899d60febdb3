"""Offline catch-up: a device was offline while 10,000 messages arrived over 100
conversations; how long does it take to hold all of them again? Against a real
``im-server serve``, compared in the same run with the naive way.

    ./scripts/bench catch_up [--convs 100] [--messages 10000] [--json]

It starts its own PostgreSQL and Redis (embedded, in a temp folder) and a server child
process, and stops them all at the end, also on error or Ctrl-C.

Setup (not measured): a receiver and ``--senders`` senders register through the API;
each sender befriends the receiver (one single chat each) and the remaining
conversations are groups of the receiver and one sender. Each conversation gets one
message over REST first: conversations with a past, and their first seq block taken
outside the storm (100 fresh conversations hit by hundreds of sends in flight would
each ask PostgreSQL for a block per send and exhaust the server's pool; sends refused
``unavailable`` are retried with the same client_msg_id and counted). The receiver's
device syncs once (its state before going offline: version V, every window known,
seq 1 of each conversation held), then goes away.
The senders send the messages over their WebSockets, ``--window`` sends in flight each,
and the benchmark waits until the persister has written every one (history ``max_seq``)
before any timing.

Measured, ``--runs`` times from the same state (version V), median reported:
* sync + pull (the recipe, ``im_server.client.SyncState``):
  ``GET /v1/sync?since=<last>&recent=100&limit=100`` while ``has_more``, then the seq
  ranges the device still lacks with history (asc, ``limit=500``), duplicates dropped
  by ``(conv_id, seq)``;
* naive: ``GET /v1/conversations``, then every conversation's history after the seq
  the device holds, page by page, ``limit=50`` ascending (one request per 50
  messages), as a client without sync would do.
Both are sequential, one request at a time, as a phone would do it. Requests and
response body bytes are counted by the HTTP pool's response hook; each run checks that the device ends
up with every sent message exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from im_server.bench.cluster import ServerProcess
from im_server.bench.common import report, run_with_server
from im_server.client import Client, Connection, SyncState
from im_server.client.transport import HttpPool, Response

PASSWORD = "bench-password-1234"

# --------------------------------------------------------------------------- counting


@dataclass
class Counter:
    requests: int = 0
    bytes: int = 0

    def reset(self) -> None:
        self.requests = self.bytes = 0


def counting_http(counter: Counter) -> HttpPool:
    def on_response(resp: Response) -> None:
        counter.requests += 1
        counter.bytes += len(resp.content)

    return HttpPool(timeout=60.0, connect_timeout=10.0, on_response=on_response)


# --------------------------------------------------------------------------- the two ways


async def pull(
    client: Client, state: SyncState, conv: str, begin: int, end: int, page: int
) -> list[Mapping[str, Any]]:
    """Ascending history pages over [begin, end]; the new messages (dedup by seq)."""
    new: list[Mapping[str, Any]] = []
    cur = begin
    while cur <= end:
        hi = min(end, cur + page - 1)
        ans = await client.history(conv, begin=cur, end=hi, limit=page, order="asc")
        state.observe_window(conv, min_seq=ans.get("min_seq"))
        new += state.add_messages(ans["messages"])
        covered = min(hi, int(ans["max_seq"]))
        state.mark_pulled(conv, cur, covered)
        if covered < hi:
            state.release(conv, covered + 1, end)
            break
        cur = hi + 1
    return new


async def sync_catch_up(
    client: Client, state: SyncState, recent: int, limit: int, page: int
) -> list[Mapping[str, Any]]:
    """The recipe: sync pages from the last version, then the missing ranges."""
    new: list[Mapping[str, Any]] = []
    ranges = []
    while True:
        resp = await client.sync(since=state.version, recent=recent, limit=limit)
        ranges += state.apply_sync(resp)
        for st in resp["conversations"]:
            new += state.add_messages(st["messages"])
        if not resp["has_more"]:
            break
    for conv, begin, end in ranges:
        new += await pull(client, state, conv, begin, end, page)
    return new


async def naive_catch_up(client: Client, held: SyncState, page: int = 50) -> list[dict[str, Any]]:
    """Every conversation's history after what ``held`` holds, ``page`` per request."""
    got: list[dict[str, Any]] = []
    for st in await client.conversations():
        conv = st["conv_id"]
        cur, top = max(int(st["min_seq"]), held.contiguous(conv) + 1), int(st["max_seq"])
        while cur <= top:
            ans = await client.history(conv, begin=cur, end=cur + page - 1, limit=page)
            got += ans["messages"]
            if ans["is_end"]:
                break
            cur += page
    return got


# --------------------------------------------------------------------------- setup


async def send_plan(
    conn: Connection, plan: list[tuple[str, str]], window: int, retries: list[int]
) -> dict[str, int]:
    """Send with ``window`` sends in flight; return the top acked seq per conversation.
    A send refused as ``unavailable`` is retried with the same client_msg_id (the server
    dedupes it), as a client would; ``retries`` counts them."""
    sem = asyncio.Semaphore(window)
    tops: dict[str, int] = {}
    failures: list[Any] = []

    async def one(conv: str, txt: str) -> None:
        cmid = uuid.uuid4().hex
        try:
            for attempt in range(6):
                ack = await asyncio.wait_for(
                    await conn.send_nowait(conv, txt, client_msg_id=cmid), 30.0
                )
                if ack.get("ok") or ack.get("code") != "unavailable":
                    break
                retries[0] += 1
                await asyncio.sleep(0.1 * 2**attempt)
            if ack.get("ok"):
                tops[conv] = max(tops.get(conv, 0), int(ack["seq"]))
            else:
                failures.append(ack)
        finally:
            sem.release()

    tasks = []
    for conv, txt in plan:
        await sem.acquire()
        tasks.append(asyncio.create_task(one(conv, txt)))
    await asyncio.gather(*tasks)
    if failures:
        raise RuntimeError(f"{len(failures)} sends refused, first: {failures[0]}")
    return tops


async def wait_persisted(client: Client, tops: dict[str, int], timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    pending = dict(tops)
    while pending:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{len(pending)} conversations not persisted after {timeout} s")
        for conv, top in list(pending.items()):
            if (await client.history(conv, limit=1, order="desc"))["max_seq"] >= top:
                del pending[conv]
        if pending:
            await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def send_plan_rest(sender: Client, conv: str) -> None:
    ack = await sender.send_rest(conv, f"hello {conv}")
    assert ack["seq"] == 1, ack


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def bench(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    url = server.url
    run = uuid.uuid4().hex[:6]
    setup_http = HttpPool(timeout=60.0, connect_timeout=10.0)
    counter = Counter()
    http = counting_http(counter)
    senders: list[Client] = []
    try:
        t_setup = time.monotonic()
        rcv = await Client.register(url, f"cu{run}r", PASSWORD, http=setup_http)
        senders = [
            await Client.register(url, f"cu{run}s{i}", PASSWORD, http=setup_http)
            for i in range(args.senders)
        ]
        rcv_id = int(rcv.user_id or 0)
        n_single = min(args.senders, args.convs)
        convs: list[tuple[Client, str]] = []
        for s in senders[:n_single]:
            convs.append((s, await rcv.accept_friend(await s.request_friend(rcv_id))))
        for i in range(args.convs - n_single):
            s = senders[i % len(senders)]
            g = await s.create_group(f"bench {i}", [rcv_id])
            convs.append((s, g["conv_id"]))

        # one message per conversation before the device goes offline: conversations
        # with a past, and their first seq block is taken outside the measured storm
        retries = [0]
        for s, conv in convs:
            await send_plan_rest(s, conv)
        device = await Client.login(url, f"cu{run}r", PASSWORD, device_id="phone", http=http)
        await wait_persisted(rcv, {conv: 1 for _, conv in convs})
        before = SyncState()
        await sync_catch_up(device, before, args.recent, args.limit, args.page)
        setup_s = time.monotonic() - t_setup

        # --- offline: the messages arrive
        mine: dict[int, list[tuple[str, int]]] = {id(s): [] for s in senders}
        for (s, conv), n in zip(convs, split(args.messages, len(convs)), strict=True):
            mine[id(s)].append((conv, n))
        pad = "x" * args.text
        plans = {  # each sender interleaves its conversations
            key: [
                (c, f"catch-up {c} #{k} {pad}")
                for k in range(max(n for _, n in lst))
                for c, n in lst
                if k < n
            ]
            for key, lst in mine.items()
            if lst
        }
        conns = [await s.connect(queue_events=False) for s in senders]
        t0 = time.monotonic()
        try:
            parts = await asyncio.gather(
                *(
                    send_plan(c, plans.get(id(s), []), args.window, retries)
                    for c, s in zip(conns, senders, strict=True)
                )
            )
        finally:
            for c in conns:
                await c.close()
        send_s = time.monotonic() - t0
        tops = {k: v for part in parts for k, v in part.items()}
        persist_s = await wait_persisted(rcv, tops)
        expected = sum(split(args.messages, len(convs)))

        # --- measured
        sync_runs, naive_runs = [], []
        for _ in range(args.runs):
            state = copy.deepcopy(before)
            counter.reset()
            t = time.perf_counter()
            new = await sync_catch_up(device, state, args.recent, args.limit, args.page)
            wall = time.perf_counter() - t
            keys = {(m["conv_id"], m["seq"]) for m in new}
            ok = len(new) == len(keys) == expected and all(
                state.contiguous(c) >= top for c, top in tops.items()
            )
            sync_runs.append(
                {
                    "wall_s": wall,
                    "requests": counter.requests,
                    "bytes": counter.bytes,
                    "messages": len(new),
                    "ok": ok,
                }
            )
        for _ in range(args.runs):
            counter.reset()
            t = time.perf_counter()
            got = await naive_catch_up(device, before, args.naive_page)
            wall = time.perf_counter() - t
            keys = {(m["conv_id"], m["seq"]) for m in got}
            ok = len(got) == len(keys) == expected
            naive_runs.append(
                {
                    "wall_s": wall,
                    "requests": counter.requests,
                    "bytes": counter.bytes,
                    "messages": len(got),
                    "ok": ok,
                }
            )
    finally:
        for s in senders:
            await s.aclose()
        await http.aclose()
        await setup_http.aclose()

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        walls = [r["wall_s"] for r in runs]
        return {
            "wall_s_median": round(statistics.median(walls), 4),
            "wall_s_min": round(min(walls), 4),
            "wall_s_max": round(max(walls), 4),
            "requests": runs[-1]["requests"],
            "bytes": runs[-1]["bytes"],
            "messages": runs[-1]["messages"],
            "ok": all(r["ok"] for r in runs),
        }

    sy, nv = summary(sync_runs), summary(naive_runs)
    return {
        "benchmark": "catch_up",
        "machine": {"cpus": os.cpu_count(), "note": "shared, noisy"},
        "params": {
            "convs": args.convs,
            "messages": args.messages,
            "senders": args.senders,
            "window": args.window,
            "recent": args.recent,
            "limit": args.limit,
            "page": args.page,
            "naive_page": args.naive_page,
            "runs": args.runs,
            "text_pad": args.text,
        },
        "setup": {
            "setup_s": round(setup_s, 2),
            "send_s": round(send_s, 2),
            "send_rate_per_s": round(args.messages / send_s) if send_s else None,
            "persist_wait_s": round(persist_s, 2),
            "send_retries_unavailable": retries[0],
        },
        "sync": sy,
        "naive": nv,
        "ratio_naive_over_sync": round(nv["wall_s_median"] / sy["wall_s_median"], 2),
        "goal_under_1s": sy["wall_s_median"] < 1.0,
    }


# --------------------------------------------------------------------------- output


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    p, s, n, st = res["params"], res["sync"], res["naive"], res["setup"]
    t = Table(
        title=f"Offline catch-up: {p['messages']:,} messages over {p['convs']} conversations, "
        f"median of {p['runs']} runs, {res['machine']['cpus']} CPUs (shared)"
    )
    t.add_column("")
    t.add_column(f"sync (recent={p['recent']}, limit={p['limit']}) + pull", justify="right")
    t.add_column(f"naive (history, {p['naive_page']} per request)", justify="right")
    for label, key, fmt in (
        ("wall, median", "wall_s_median", "{:.3f} s"),
        ("wall, min / max", None, ""),
        ("messages received", "messages", "{:,}"),
        ("requests", "requests", "{:,}"),
        ("response bytes", "bytes", "{:,}"),
        ("every message once", "ok", "{}"),
    ):
        if key is None:
            t.add_row(
                label,
                f"{s['wall_s_min']:.3f} / {s['wall_s_max']:.3f} s",
                f"{n['wall_s_min']:.3f} / {n['wall_s_max']:.3f} s",
            )
        else:
            t.add_row(label, fmt.format(s[key]), fmt.format(n[key]))
    console = Console()
    console.print(t)
    console.print(
        f"ratio naive / sync (wall) = {res['ratio_naive_over_sync']}x; goal < 1 s: "
        f"{'met' if res['goal_under_1s'] else 'NOT met'}. Setup: sends took {st['send_s']} s "
        f"({st['send_rate_per_s']}/s, {st['send_retries_unavailable']} retried after "
        f"'unavailable'), persisted {st['persist_wait_s']} s later."
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench catch_up", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--convs", type=int, default=100, help="conversations of the receiver")
    ap.add_argument("--messages", type=int, default=10_000, help="messages sent while offline")
    ap.add_argument("--senders", type=int, default=10, help="sending users (one single chat each)")
    ap.add_argument("--window", type=int, default=64, help="sends in flight per sender")
    ap.add_argument("--recent", type=int, default=100, help="sync: newest messages per state")
    ap.add_argument("--limit", type=int, default=100, help="sync: states per page")
    ap.add_argument("--page", type=int, default=500, help="history page of the recipe's pulls")
    ap.add_argument("--naive-page", type=int, default=50, help="history page of the baseline")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each way")
    ap.add_argument("--text", type=int, default=20, help="padding characters per message text")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.convs < 1 or args.senders < 1 or args.messages < args.convs or args.runs < 1:
        ap.error("--convs, --senders, --runs >= 1 and --messages >= --convs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run_with_server("im-catch-up-", lambda stores, server: bench(args, server))
    report(res, args.json, print_table)
    return 0 if res["sync"]["ok"] and res["naive"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
