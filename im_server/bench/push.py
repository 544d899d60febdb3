"""Pushes to phones: a group of offline members with push registrations gets messages,
and the server posts one Matrix push-gateway notification per (message, member) to a
real gateway (``im_server.bench.push_gateway.RecordingGateway``, HTTP, in a thread of
this process), against a real ``im-server serve``.

    ./scripts/bench push [--members 1000] [--messages 5] [--rate R] [--sends 1500] [--runs 3]
        [--paced-rate 100] [--paced-seconds 3] [--json]

It starts two stacks (PostgreSQL, Redis and a server each, in temp folders): one with
``IM_PUSH_GATEWAY_URL`` set (push on), one without (push off), and stops them at the end.

Measured, on the push-on stack, a group of one sender and ``--members`` members, each
with a live session (never connected: every member gets every push) and a registration
with its own pushkey:
* burst: ``--messages`` sends as fast as the sender's socket acks them (10 in flight);
  pushes/s from the first send to the last notification at the gateway;
* paced: as many sends again at an even pace of half the burst's capacity; latency of
  each push from its message's ack (client clock) to its arrival at the gateway
  (p50, p99, max), the same clock on both ends;
* both: server CPU (the server process, and PostgreSQL + Redis, from /proc) per push;
  every (message, pushkey) is checked to arrive once, with the badge right after that
  message (the members read nothing, so the badge of the k-th message is k).

Send-path cost, in the same run: a sender and a connected receiver (friends, no push
registrations) in a single chat on each stack; per run ``--sends`` messages at full
speed (10 in flight), then ``--paced-rate`` msg/s for ``--paced-seconds``; runs
alternate off, on, off, on... (``--runs`` each). With push on the persister writes a
``push_outbox`` row per message and the pusher takes and deletes them (no recipient: no
gateway call); a run ends once the messages are stored and, with push on, the outbox is
empty. Reported: median server CPU per message (the server process, and with
PostgreSQL + Redis), on / off.

Setup (not measured): users, sessions and registrations are inserted with SQL, the
group is created through the REST API by its sender, one message is pushed to warm up.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from im_server.bench.cluster import ServerProcess, Stores, pg_dsn
from im_server.bench.common import report, run_with_stacks
from im_server.bench.push_gateway import RecordingGateway
from im_server.bench.read_storm import make_users, pct, wait_persisted
from im_server.bench.stack import Procs
from im_server.client import Client, Connection
from im_server.client.transport import HttpPool

APP_ID = "im.bench.push"
WINDOW = 10  # sends in flight on one socket


@dataclass
class Stack:
    """One server with its stores, and the processes whose CPU is counted."""

    stores: Stores
    server: ServerProcess
    server_procs: Procs = field(init=False)
    store_procs: Procs = field(init=False)

    def __post_init__(self) -> None:
        assert self.server.proc is not None
        self.server_procs = Procs(tree_roots=[self.server.proc.pid])
        self.store_procs = Procs(
            pids=[self.stores.redis.pid() or 0], tree_roots=[self.stores.pg.pid() or 0]
        )

    def cpu(self) -> tuple[float, float]:
        """(server process, PostgreSQL + Redis) CPU seconds so far."""
        return self.server_procs.cpu(), self.store_procs.cpu()


# --------------------------------------------------------------------------- sending


async def send_all(
    conn: Connection, conv: str, n: int, tag: str, rate: float | None = None
) -> dict[int, float]:
    """Send n texts, at most WINDOW in flight, evenly paced at ``rate`` per second if
    given; {seq: time.time() when its ack arrived}."""
    acks: dict[int, float] = {}
    gate = asyncio.Semaphore(WINDOW)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        try:
            ack = await asyncio.wait_for(fut_of[i], 30)
        finally:
            gate.release()
        at = time.time()
        if not ack.get("ok"):
            raise RuntimeError(f"send refused: {ack}")
        acks[int(ack["seq"])] = at

    fut_of: dict[int, asyncio.Future[Any]] = {}
    tasks = []
    for i in range(n):
        if rate:
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await gate.acquire()
        fut_of[i] = await conn.send_nowait(conv, {"text": f"{tag} {i}"}, client_msg_id=f"{tag}-{i}")
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return acks


async def wait_outbox_empty(pg: asyncpg.Connection, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while await pg.fetchval("SELECT count(*) FROM push_outbox"):
        if time.monotonic() > deadline:
            raise TimeoutError("the push outbox did not drain")
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- send path


@dataclass
class Pair:
    stack: Stack
    pg: asyncpg.Connection
    conv: str
    sender: Client
    receiver: Client
    sock: Connection | None = None


async def make_pair(stack: Stack, pg: asyncpg.Connection, http: HttpPool) -> Pair:
    run = uuid.uuid4().hex[:8]
    (a, ta), (b, tb) = await make_users(pg, 2, run)
    sender = Client(stack.server.url, ta, user_id=a, http=http)
    receiver = Client(stack.server.url, tb, user_id=b, http=http)
    conv = await receiver.accept_friend(await sender.request_friend(b))
    pair = Pair(stack, pg, conv, sender, receiver)
    await receiver.connect(queue_events=False)
    pair.sock = await sender.connect(queue_events=False)
    return pair


async def send_path_run(
    pair: Pair, n: int, push_on: bool, tag: str, rate: float | None = None
) -> dict[str, float]:
    assert pair.sock is not None
    cpu0 = pair.stack.cpu()
    acks = await send_all(pair.sock, pair.conv, n, tag, rate)
    await wait_persisted(pair.pg, pair.conv, max(acks))
    if push_on:
        await wait_outbox_empty(pair.pg)
    cpu1 = pair.stack.cpu()
    srv = (cpu1[0] - cpu0[0]) * 1e6 / n
    stores = (cpu1[1] - cpu0[1]) * 1e6 / n
    return {"server_us": round(srv, 1), "with_stores_us": round(srv + stores, 1)}


async def send_path(
    args: argparse.Namespace, on: Stack, off: Stack, pgs: dict[str, asyncpg.Connection]
) -> dict[str, Any]:
    """Both loads, full speed and paced, alternating off and on."""
    async with HttpPool(timeout=30) as http:
        pairs = {"off": await make_pair(off, pgs["off"], http)}
        pairs["on"] = await make_pair(on, pgs["on"], http)
        for name, p in pairs.items():  # warm up: token cache, seq block, code paths
            await send_path_run(p, 200, name == "on", f"warm-{name}")
        loads = {
            "full": (args.sends, None),
            "paced": (int(args.paced_rate * args.paced_seconds), args.paced_rate),
        }
        out: dict[str, Any] = {}
        for load, (n, rate) in loads.items():
            runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for i in range(args.runs):
                for name in ("off", "on"):
                    tag = f"{load}-{name}{i}"
                    runs[name].append(await send_path_run(pairs[name], n, name == "on", tag, rate))
            med = {
                name: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
                for name, rs in runs.items()
            }
            out[load] = {
                "sends_per_run": n,
                "rate_msg_s": rate,
                "runs": runs,
                "median": med,
                "ratio_on_off": {
                    k: round(med["on"][k] / med["off"][k], 3) if med["off"][k] else None
                    for k in med["on"]
                },
            }
        for p in pairs.values():
            await p.sender.aclose()
            await p.receiver.aclose()
    return out


# --------------------------------------------------------------------------- fan-out


@dataclass
class Group:
    conv: str
    sock: Connection
    sender: Client
    pushkeys: set[str]
    sent: list[int] = field(default_factory=list)  # every seq sent, in order


async def make_group(stack: Stack, pg: asyncpg.Connection, http: HttpPool, members: int) -> Group:
    run = uuid.uuid4().hex[:8]
    users = await make_users(pg, 1 + members, run)
    (sid, stoken), rest = users[0], users[1:]
    now = int(time.time() * 1000)
    rows = [
        (hashlib.sha256(t.encode()).digest(), u, "bench", APP_ID, f"pk-{run}-{u}", "fcm", now)
        for u, t in rest
    ]
    await pg.executemany(
        "INSERT INTO push_registrations "
        "(token_hash, user_id, device_id, app_id, pushkey, platform, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7)",
        rows,
    )
    sender = Client(stack.server.url, stoken, user_id=sid, http=http)
    conv = (await sender.create_group("push bench", [u for u, _ in rest]))["conv_id"]
    sock = await sender.connect(queue_events=False)
    return Group(str(conv), sock, sender, {r[4] for r in rows})


async def wait_pushes(gw: RecordingGateway, start: int, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(gw.received) - start < count:
        if time.monotonic() > deadline:
            got = len(gw.received) - start
            raise TimeoutError(f"{got} of {count} pushes arrived in {timeout} s")
        await asyncio.sleep(0.02)


async def fan_out_phase(
    stack: Stack,
    gw: RecordingGateway,
    g: Group,
    n: int,
    rate: float | None,
    tag: str,
) -> dict[str, Any]:
    """Send n messages to the group; every member's push must arrive, once, with its
    badge. Returns rates, latencies and CPU."""
    start = len(gw.received)
    expected = n * len(g.pushkeys)
    cpu0 = stack.cpu()
    t0 = time.time()
    acks = await send_all(g.sock, g.conv, n, tag, rate)
    g.sent += sorted(acks)
    await wait_pushes(gw, start, expected, timeout=60 + expected / 200)
    await asyncio.sleep(0.3)  # anything more (a repeat) would arrive now
    cpu1 = stack.cpu()
    got = gw.snapshot()[start:]
    rank = {s: i + 1 for i, s in enumerate(g.sent)}  # the badge right after seq s
    seen: set[tuple[int, str]] = set()
    lat: list[float] = []
    dup = bad_badge = stray = 0
    devices = 0
    for r in got:
        conv, _, seq_s = r.notification.get("event_id", "/").rpartition("/")
        seq = int(seq_s) if seq_s.isdigit() else -1
        if conv != g.conv or seq not in acks:
            stray += 1
            continue
        for k in r.pushkeys:
            devices += 1
            if (seq, k) in seen:
                dup += 1
            seen.add((seq, k))
        lat.append(r.at - acks[seq])
        if r.notification["counts"]["unread"] != rank[seq]:
            bad_badge += 1
    last = max(r.at for r in got)
    wall = last - t0
    ms = [x * 1000 for x in lat]
    srv = cpu1[0] - cpu0[0]
    stores = cpu1[1] - cpu0[1]
    pushes = len(got) - stray
    return {
        "messages": n,
        "rate_msg_s": round(rate, 2) if rate else None,
        "pushes": pushes,
        "devices": devices,
        "missing": expected - len(seen),
        "duplicates": dup,
        "stray": stray,
        "bad_badges": bad_badge,
        "wall_s": round(wall, 2),
        "pushes_per_s": round(pushes / wall, 1),
        "devices_per_s": round(devices / wall, 1),
        "latency_p50_ms": round(pct(ms, 50), 1),
        "latency_p99_ms": round(pct(ms, 99), 1),
        "latency_max_ms": round(max(ms), 1),
        "server_cpu_s": round(srv, 2),
        "server_cpu_us_per_push": round(srv * 1e6 / pushes, 1),
        "stores_cpu_us_per_push": round(stores * 1e6 / pushes, 1),
        "ok": expected == len(seen) == pushes and not dup and not bad_badge,
    }


async def fan_out(
    args: argparse.Namespace, on: Stack, pg: asyncpg.Connection, gw: RecordingGateway
) -> dict[str, Any]:
    async with HttpPool(timeout=60) as http:
        g = await make_group(on, pg, http, args.members)
        await fan_out_phase(on, gw, g, 1, None, "warm")
        burst = await fan_out_phase(on, gw, g, args.messages, None, "burst")
        rate = args.rate or burst["pushes_per_s"] / args.members / 2
        paced = await fan_out_phase(on, gw, g, args.messages, rate, "paced")
        await g.sender.aclose()
    return {"burst": burst, "paced": paced}


# --------------------------------------------------------------------------- main


async def bench(
    args: argparse.Namespace, stacks: dict[str, tuple[Stores, ServerProcess]], gw: RecordingGateway
) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)
    st = {name: Stack(*s) for name, s in stacks.items()}
    pgs = {name: await asyncpg.connect(pg_dsn(s.stores)) for name, s in st.items()}
    try:
        sp = await send_path(args, st["on"], st["off"], pgs)
        fo = await fan_out(args, st["on"], pgs["on"], gw)
    finally:
        for c in pgs.values():
            await c.close()
    return {
        "benchmark": "push",
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "params": {"members": args.members, "messages": args.messages, "window": WINDOW},
        "fan_out": fo,
        "send_path": sp,
        "gateway_invalid_requests": gw.invalid,
    }


def print_table(res: dict[str, Any]) -> None:
    p, fo, sp = res["params"], res["fan_out"], res["send_path"]
    m = res["machine"]
    print(
        f"push: group of 1 sender + {p['members']} offline members with a registration each; "
        f"{m['cpus']} CPUs, load {m['loadavg_1m_start']} -> {m['loadavg_1m_end']}"
    )
    print(f"{'':34} {'burst':>14} {'paced':>14}")
    b, q = fo["burst"], fo["paced"]
    rows = [
        ("messages (rate msg/s)", f"{b['messages']}", f"{q['messages']} ({q['rate_msg_s']})"),
        ("pushes (devices)", f"{b['pushes']} ({b['devices']})", f"{q['pushes']} ({q['devices']})"),
        (
            "missing / dup / bad badge",
            *(f"{r['missing']}/{r['duplicates']}/{r['bad_badges']}" for r in (b, q)),
        ),
        ("wall, first send -> last push", f"{b['wall_s']} s", f"{q['wall_s']} s"),
        ("pushes/s", b["pushes_per_s"], q["pushes_per_s"]),
        ("latency ack -> gateway p50", f"{b['latency_p50_ms']} ms", f"{q['latency_p50_ms']} ms"),
        ("latency ack -> gateway p99", f"{b['latency_p99_ms']} ms", f"{q['latency_p99_ms']} ms"),
        ("latency max", f"{b['latency_max_ms']} ms", f"{q['latency_max_ms']} ms"),
        (
            "server CPU per push",
            f"{b['server_cpu_us_per_push']} µs",
            f"{q['server_cpu_us_per_push']} µs",
        ),
        (
            "PostgreSQL + Redis CPU per push",
            f"{b['stores_cpu_us_per_push']} µs",
            f"{q['stores_cpu_us_per_push']} µs",
        ),
        ("ok", b["ok"], q["ok"]),
    ]
    for name, x, y in rows:
        print(f"{name:34} {x!s:>14} {y!s:>14}")
    print(
        f"send path, single chat without registrations, {len(sp['full']['runs']['on'])} runs "
        "of each (off and on alternating), median CPU per message:"
    )
    print(f"{'':44} {'push off':>10} {'push on':>10} {'on/off':>7}")
    for x in sp.values():
        what = (
            f"{x['sends_per_run']} sends at {x['rate_msg_s']:g} msg/s"
            if x["rate_msg_s"]
            else f"{x['sends_per_run']} sends, {p['window']} in flight"
        )
        off, on, r = x["median"]["off"], x["median"]["on"], x["ratio_on_off"]
        print(
            f"{what + ', server':44} {off['server_us']:>7} µs {on['server_us']:>7} µs "
            f"{r['server_us']:>7}"
        )
        print(
            f"{what + ', + PostgreSQL, Redis':44} {off['with_stores_us']:>7} µs "
            f"{on['with_stores_us']:>7} µs {r['with_stores_us']:>7}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./scripts/bench push", description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=1000, help="offline members with a device")
    ap.add_argument("--messages", type=int, default=5, help="group messages per phase")
    ap.add_argument(
        "--rate", type=float, default=0.0, help="paced phase, msg/s (default: half the burst's)"
    )
    ap.add_argument("--sends", type=int, default=1500, help="single-chat sends per run")
    ap.add_argument("--runs", type=int, default=3, help="send-path runs per setting")
    ap.add_argument("--paced-rate", type=float, default=100.0, help="paced send path, msg/s")
    ap.add_argument("--paced-seconds", type=float, default=3.0, help="paced send path run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    gw = RecordingGateway().start()
    try:
        res = run_with_stacks(
            "im-push-",
            {"on": {"IM_PUSH_GATEWAY_URL": gw.url}, "off": {}},
            lambda stacks: bench(args, stacks, gw),
        )
    finally:
        gw.stop()
    report(res, args.json, print_table)
    ok = res["fan_out"]["burst"]["ok"] and res["fan_out"]["paced"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
