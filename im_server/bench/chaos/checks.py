"""The checks run once a scenario's load has stopped and the stream has drained: what
PostgreSQL holds against every ack received (DESIGN.md invariants 1-4), resends of old
client_msg_ids, and the REST history against PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import random

import asyncpg

from im_server.bench.chaos.load import Load, Sent
from im_server.bench.chaos.report import Result
from im_server.bench.chaos.rig import Monitor, Rig
from im_server.client import Client, Connection, JsonObject


async def check_resends(
    rig: Rig,
    load: Load,
    users: list[Client],
    prekill: dict[str, Sent],
    t_restart: float,
    res: Result,
) -> None:
    """Send again a sample of the acked client_msg_ids (before the kill and after the
    restart): each must answer ``duplicate`` with its first seq."""
    rnd = random.Random(7)
    before = list(prekill.items())
    after = [(c, s) for c, s in load.ok_acked().items() if s.t_first >= t_restart]
    sample = rnd.sample(before, min(len(before), rig.p.resend_sample))
    sample += rnd.sample(after, min(len(after), rig.p.resend_sample // 2))
    by_uid = {int(u.user_id or 0): u for u in users}
    live = rig.urls
    conns: dict[int, Connection] = {}
    try:
        for cmid, s in sample:
            first = s.acks[0]
            if rig.scenario == "redis-empty" and cmid not in await _persisted(
                rig, [(s.sender, cmid)]
            ):
                continue  # wiped with the Redis data: nothing remembers it (counted apart)
            client = by_uid[s.sender]
            client.base_url = live[-1]
            ack: JsonObject = {}
            try:
                conn = conns.get(s.sender)
                if conn is None:
                    conn = conns[s.sender] = await client.connect(queue_events=False)
                for _ in range(50):
                    ack = await conn.send(s.conv_id, "resend", client_msg_id=cmid, timeout=10)
                    if ack.get("ok") or ack.get("code") != "unavailable":
                        break
                    await asyncio.sleep(0.1)
            except Exception as e:  # noqa: BLE001
                conns.pop(s.sender, None)
                ack = {"error": repr(e)}
            if not (
                ack.get("ok")
                and ack.get("duplicate") is True
                and ack.get("conv_id") == first.conv_id
                and int(ack.get("seq", -1)) == first.seq
            ):
                res.resend_bad.append(
                    f"resend of {cmid} (sender {s.sender}, first acked {first.conv_id}/{first.seq}"
                    f" at t_kill{first.t - load.t_kill:+.3f}s) answered {ack}"
                )
    finally:
        for conn in conns.values():
            with contextlib.suppress(Exception):
                await conn.close()


async def _persisted(rig: Rig, keys: list[tuple[int, str]]) -> set[str]:
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            # by the dedupe key, then the message it claimed (by its conv_id)
            "SELECT m.client_msg_id FROM message_dedupe d JOIN unnest($1::bigint[], $2::text[])"
            " AS k(s, c) ON d.sender_id = k.s AND d.client_msg_id = k.c"
            " JOIN messages m ON m.conv_id = d.conv_id AND m.seq = d.seq",
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
    finally:
        await conn.close()
    return {r["client_msg_id"] for r in rows}


async def verify(
    rig: Rig,
    load: Load,
    all_convs: list[str],
    t_kill: float,
    t_restart: float,
    prekill: dict[str, Sent],
    res: Result,
    mon: Monitor,
) -> None:
    """Every ack against what PostgreSQL holds (lost, duplicated, seq reused or gone
    back, read cursors behind what the server confirmed), then the figures."""
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            "SELECT conv_id, seq, sender_id, client_msg_id FROM messages WHERE conv_id = ANY($1)",
            all_convs,
        )
        dup_keys = await conn.fetch(
            "SELECT sender_id, client_msg_id, count(*) AS n FROM messages WHERE conv_id = ANY($1)"
            " GROUP BY 1, 2 HAVING count(*) > 1",
            all_convs,
        )
        dup_seqs = await conn.fetch(
            "SELECT conv_id, seq, count(*) AS n FROM messages WHERE conv_id = ANY($1)"
            " GROUP BY 1, 2 HAVING count(*) > 1",
            all_convs,
        )
        cursors = await conn.fetch(
            "SELECT conv_id, user_id, read_seq FROM conv_members WHERE conv_id = ANY($1)",
            all_convs,
        )
    finally:
        await conn.close()

    acked = load.ok_acked()
    res.sends = len(load.sent)
    res.acked_total = len(acked)
    res.attempts = sum(s.attempts for s in load.sent.values())
    res.duplicate_acks = sum(1 for s in load.sent.values() for a in s.acks if a.duplicate)
    res.refused = sum(1 for s in load.sent.values() if s.refused)
    res.unanswered = sum(1 for s in load.sent.values() if not s.acks and not s.refused)

    for r in dup_keys:
        res.duplicated.append(
            f"PostgreSQL holds ({r['sender_id']}, {r['client_msg_id']}) {r['n']} times"
        )
    for r in dup_seqs:
        res.duplicated.append(f"PostgreSQL holds {r['conv_id']}/{r['seq']} {r['n']} times")
    by_key: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for r in rows:
        by_key.setdefault((int(r["sender_id"]), str(r["client_msg_id"])), []).append(
            (str(r["conv_id"]), int(r["seq"]))
        )

    # acks: one (conv, seq) per client_msg_id, one client_msg_id per (conv, seq)
    seq_owner: dict[tuple[str, int], str] = {}
    for cmid, s in acked.items():
        places = {(a.conv_id, a.seq) for a in s.acks}
        if len(places) > 1:
            res.duplicated.append(
                f"{cmid} (sender {s.sender}) acked with several seqs {sorted(places)}"
            )
        for place in places:
            other = seq_owner.setdefault(place, cmid)
            if other != cmid:
                res.duplicated.append(
                    f"{place[0]}/{place[1]} acked for two sends: {other} and {cmid} (seq reused)"
                )

    # lost: every ack's (conv, seq, client_msg_id) in PostgreSQL
    missing: list[tuple[str, Sent]] = []
    wiped: set[str] = set()
    for cmid, s in acked.items():
        a = s.acks[0]
        got = by_key.get((s.sender, cmid), [])
        if got == [(a.conv_id, a.seq)]:
            continue
        if not got:
            missing.append((cmid, s))
            continue
        res.lost.append(
            f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} "
            f"({'before' if a.t < t_kill else 'after'} the kill, t_kill{a.t - t_kill:+.3f}s) "
            f"but PostgreSQL holds it at {got}"
        )
    if rig.scenario == "redis-empty":
        # The stream's tail went with the Redis data: acks given by the old Redis (before
        # the restart) above the highest persisted seq of those acks in the conversation.
        # A missing one below it is a hole, and a real loss.
        top_old: dict[str, int] = {}
        for cmid, s in acked.items():
            a = s.acks[0]
            if a.t < t_restart and by_key.get((s.sender, cmid)):
                top_old[a.conv_id] = max(top_old.get(a.conv_id, 0), a.seq)
        for cmid, s in missing:
            a = s.acks[0]
            if a.t < t_restart and a.seq > top_old.get(a.conv_id, 0):
                res.wiped += 1
                wiped.add(cmid)
            else:
                res.lost.append(
                    f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} at t_kill{a.t - t_kill:+.3f}s"
                    f" is not in PostgreSQL (highest persisted seq acked by the old Redis there: "
                    f"{top_old.get(a.conv_id, 0)})"
                )
    else:
        for cmid, s in missing:
            a = s.acks[0]
            res.lost.append(
                f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} "
                f"({'before' if a.t < t_kill else 'after'} the kill, t_kill{a.t - t_kill:+.3f}s, "
                f"{s.attempts} attempts) is not in PostgreSQL"
            )

    # seqs never reused, never back: sends first made after the restart are above every
    # seq acked before the kill
    before: dict[str, int] = {}
    for s in prekill.values():
        for a in s.acks:
            if a.t < t_kill:
                before[a.conv_id] = max(before.get(a.conv_id, 0), a.seq)
    for cmid, s in acked.items():
        if s.t_first < t_restart:
            continue
        for a in s.acks:
            if a.seq <= before.get(a.conv_id, 0):
                res.seq_violations.append(
                    f"{cmid} first sent t_kill+{s.t_first - t_kill:.2f}s got {a.conv_id}/{a.seq}"
                    f" <= {before[a.conv_id]} acked before the kill"
                )

    # read cursors: never below what the server confirmed (before the kill, and at all)
    pg_cursor = {(str(r["conv_id"]), int(r["user_id"])): int(r["read_seq"] or 0) for r in cursors}
    best_before: dict[tuple[str, int], int] = {}
    best: dict[tuple[str, int], int] = {}
    for t, uid, conv, v in load.confirmed:
        if conv not in all_convs:
            continue
        k = (conv, uid)
        best[k] = max(best.get(k, 0), v)
        if t < t_kill:
            best_before[k] = max(best_before.get(k, 0), v)
    res.read_reports_confirmed = len(load.confirmed)
    for k, v in sorted(best.items()):
        have = pg_cursor.get(k)
        if have is None or have < v:
            when = "before the kill" if best_before.get(k, 0) > (have or 0) else "after the restart"
            res.read_regressions.append(
                f"conv_members {k[0]} user {k[1]}: read_seq {have} < {v} confirmed "
                f"(max confirmed before the kill {best_before.get(k, 0)}; the lost one {when})"
            )

    # figures
    times = sorted(load.ack_times)
    window = [t for t in times if t >= t_kill - 1.0]
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    if window:
        gaps.append(window[0] - (t_kill - 1.0))
    res.max_ack_gap_s = round(max(gaps, default=0.0), 3)
    need = sum(1 for _uid, c in mon.watch if c not in wiped)
    for t, _x, _pnd, cnt in mon.samples:
        if t >= t_kill and cnt is not None and cnt >= need:
            res.backlog_persisted_s = round(t - t_kill, 3)
            break
    firsts: dict[int, float] = {}
    for s in acked.values():
        if s.t_first >= t_kill:
            firsts[s.sender] = min(firsts.get(s.sender, s.acks[0].t), s.acks[0].t)
    senders = {s.sender for s in load.sent.values()}
    if senders and set(firsts) == senders:
        res.resume_s = round(max(firsts.values()) - t_kill, 3)
    if res.first_ack_s is not None:
        res.first_ack_s = round(res.first_ack_s, 3)
    if res.drain_s is not None:
        res.drain_s = round(res.drain_s, 3)
    res.restart_s = round(res.restart_s, 3)
    res.t_kill_s = round(res.t_kill_s, 3)


async def _all_history(client: Client, conv: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    begin = 1
    for _ in range(10_000):
        r = await client.history(conv, begin=begin, end=begin + 499, limit=500, order="asc")
        out.extend((int(m["seq"]), str(m["client_msg_id"])) for m in r["messages"])
        if r["is_end"] or begin + 499 >= int(r["max_seq"]):
            break
        begin += 500
    return out


async def check_history(rig: Rig, users: list[Client], all_convs: list[str], res: Result) -> None:
    """The REST history of each conversation, read by one member, equals PostgreSQL."""
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            "SELECT conv_id, seq, client_msg_id FROM messages WHERE conv_id = ANY($1)", all_convs
        )
    finally:
        await conn.close()
    in_pg: dict[str, list[tuple[int, str]]] = {c: [] for c in all_convs}
    for r in rows:
        in_pg[str(r["conv_id"])].append((int(r["seq"]), str(r["client_msg_id"])))
    readers = {all_convs[0]: users[0], all_convs[1]: users[2], all_convs[2]: users[0]}
    for conv, client in readers.items():
        client.base_url = rig.urls[-1]
        try:
            got = await _all_history(client, conv)
        except Exception as e:  # noqa: BLE001
            res.history_bad.append(f"history of {conv} failed: {e!r}")
            continue
        want = sorted(in_pg[conv])
        if sorted(got) != want:
            extra = sorted(set(got) - set(want))[:5]
            gone = sorted(set(want) - set(got))[:5]
            res.history_bad.append(
                f"history of {conv}: {len(got)} messages, PostgreSQL {len(want)}"
                f" (only in history {extra}, only in PostgreSQL {gone})"
            )
