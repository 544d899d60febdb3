"""The unread-count query at scale: one user in 200 conversations, ~1,000,000 messages.

    ./scripts/bench unread_query [--runs 200] [--fresh 100] [--plan-out FILE] [--json]

Times the production statement, ``im_server.storage.conv_store.unread_counts(conn, U)``
(one SQL statement for all of U's conversations: read cursor, else U's last sent seq,
else 0, clamped to U's window; the counts summed from ``message_blocks``, migration
0021), through a SQLAlchemy AsyncEngine made by ``im_server.storage.db.create_engine``.
Baseline in the same run, interleaved with it: the per-conversation way, 1 + 200
statements (list U's conversations, then one COUNT per conversation that counts each
unread message, ``DIRECT_UNREAD``), which must give the same counts. Then ``EXPLAIN
(ANALYZE, BUFFERS)`` of the captured statement (custom and generic plan) is written to
``docs/unread-query-explain.md``. Beside it, interleaved: round two's statement (each
unread message counted, with mention_unread and the badge), round one's (unread only),
and production without the mentions' partial index. A seventh of U's conversations are
muted, a tenth pinned.

Where the time goes, in the same run: the production statement (p50/p95/p99) beside
variants of it, interleaved in blocks: planned at every execution (as the first five
executions on each connection are, before the plan cache keeps a generic plan), JIT
forced (only where the build has JIT), round two's statement, and no counts at all.
The parts of the custom plan's EXPLAIN ANALYZE: the block edges, my own messages, the
cursor fallback, the mention count, the rest, planning (``--plan-out`` writes the plan).
Last, ``--fresh`` new messages in each of U's conversations after the VACUUM:
the statement over rows the visibility map does not mark yet (heap fetches), then after
a VACUUM.

It starts its own PostgreSQL and Redis (embedded, temp folder, fsync OFF: only the bulk
load writes, the measured part reads) and stops them at the end, also on error.

Data (all with SQL, generate_series): ``--convs`` conversations of ``--per-conv``
messages each (default 1000 x 1000). U is in ``--u-singles`` single chats and
``--u-groups`` groups (default 150 + 50); the rest are other users' singles and groups.
In U's conversations U sent every 5th message up to a point (never, in a third of them),
about 2 % are ``system``/``recall`` notices; in groups 2 % of the messages mention U, 2 %
someone else, 0.5 % everyone (``mention_all``); U's read cursor is NULL in a quarter of them
(the fallback to U's last sent seq), elsewhere anywhere from 0 to the end; a tenth have a
window starting at 300 (joined late / cleared), a few groups one ending at 800 (left).
Then VACUUM ANALYZE.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.bench.cluster import Stores
from im_server.bench.common import (
    add_layout_args,
    check_layout_args,
    pct,
    report,
    run_with_stores,
    user_in_conversations,
)
from im_server.config import Settings
from im_server.storage import conv_states as conv_store
from im_server.storage.db import create_engine

ROOT = Path(__file__).resolve().parents[2]  # the repository
EXPLAIN_DOC = ROOT / "docs" / "unread-query-explain.md"
MIGRATION = ROOT / "migrations" / "versions" / "0001_initial.py"


# Round two's statement, which counted every unread message one index entry at a time:
# the contract's rules written the direct way. The per-conversation baseline counts with
# it (so the production statement, which sums message_blocks, is checked against an
# independent count), and the "before" figures time it.
DIRECT_UNREAD = (
    "(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id "
    f"AND x.seq > GREATEST({conv_store._CURSOR}, {conv_store._WIN_MIN} - 1) "
    "AND x.seq <= COALESCE(m.max_seq, 9223372036854775807) "
    f"AND x.sender_id <> m.user_id AND x.content_type NOT IN {conv_store.NOT_COUNTED!r})"
)
DIRECT_MENTION_UNREAD = (
    DIRECT_UNREAD[:-1] + " AND (x.mention_all OR cardinality(x.mentions) > 0) "
    "AND (x.mention_all OR m.user_id = ANY(x.mentions)))"
)
DIRECT_COUNTS = (
    conv_store._UNREAD_COUNTS.replace(conv_store.COUNTS_JOIN, "")
    .replace(conv_store._MENTION_UNREAD, DIRECT_MENTION_UNREAD)
    .replace(conv_store._UNREAD, DIRECT_UNREAD)
)
assert "message_blocks" not in DIRECT_COUNTS and "k." not in DIRECT_COUNTS


# --------------------------------------------------------------------------- data


async def build(pg: asyncpg.Connection, args: argparse.Namespace) -> dict[str, Any]:
    rnd = random.Random(7)
    # the stores run with synchronous_commit=off; VACUUM cannot mark a page all-visible
    # until the inserting commit is flushed (no hint bits before), so flush commits here
    await pg.execute("SET synchronous_commit = on")
    layout = await user_in_conversations(
        pg,
        rnd,
        convs=args.convs,
        u_singles=args.u_singles,
        u_groups=args.u_groups,
        per_conv=args.per_conv,
        prefix="uq",
    )
    u, n_users, convs, members, mine = (
        layout.user_id,
        layout.users,
        layout.convs,
        layout.members,
        layout.mine,
    )
    now = int(time.time() * 1000)
    per = args.per_conv

    # U's side of each of its conversations: cursor, window, and up to where U sent
    u_rows = []
    u_sent_until: dict[str, int] = {}
    for i, cid in enumerate(mine):
        read_seq = None if i % 4 == 0 else rnd.choice([per, rnd.randint(0, per)])
        min_seq = 300 if i % 10 == 1 else 1
        max_seq = 800 if cid.startswith("g:") and i % 25 == 3 else None
        u_sent_until[cid] = 0 if i % 3 == 0 else rnd.randint(per // 10, per)
        u_rows.append((cid, u, 0, min_seq, max_seq, read_seq, 0, None, 0, now))
    other_rows = [
        (cid, m, 0, 1, None, rnd.choice([None, rnd.randint(0, per)]), 0, None, 0, now)
        for cid, ms in members.items()
        for m in ms
        if m != u
    ]
    await pg.copy_records_to_table(
        "conv_members",
        records=u_rows + other_rows,
        columns=[
            "conv_id",
            "user_id",
            "role",
            "min_seq",
            "max_seq",
            "read_seq",
            "delivered_seq",
            "hidden_seq",
            "version",
            "joined_at",
        ],
    )

    # the messages: a staging table says who may send where, generate_series does the rest
    await pg.execute(
        "CREATE TEMP TABLE bench_convs (conv_id text, senders bigint[], u_until int, u bigint)"
    )
    await pg.copy_records_to_table(
        "bench_convs",
        records=[
            (cid, [m for m in ms if m != u], u_sent_until.get(cid, 0), u)
            for cid, ms in members.items()
        ],
    )
    t = time.monotonic()
    await pg.execute(
        """
        INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, content,
                              server_time, recalled, mentions, mention_all)
        SELECT b.conv_id, s,
               CASE WHEN s % 5 = 0 AND s <= b.u_until THEN b.u
                    ELSE b.senders[1 + (s * 7919) % cardinality(b.senders)] END,
               b.conv_id || '#' || s,
               CASE WHEN s % 97 = 0 THEN 'system' WHEN s % 89 = 0 THEN 'recall' ELSE 'text' END,
               '{"text": "hello there"}'::jsonb,
               $2::bigint + s, false,
               CASE WHEN b.conv_id LIKE 'g:%' AND s % 50 = 7 THEN ARRAY[b.u]
                    WHEN b.conv_id LIKE 'g:%' AND s % 50 = 21
                    THEN ARRAY[b.senders[1 + s % cardinality(b.senders)]]
                    ELSE '{}'::bigint[] END,
               b.conv_id LIKE 'g:%' AND s % 200 = 99
          FROM bench_convs b CROSS JOIN generate_series(1, $1::int) s
         ORDER BY b.conv_id, s
        """,
        per,
        now,
    )
    load_s = time.monotonic() - t
    await pg.execute(
        "UPDATE conv_members SET muted = (i % 7 = 2), pinned = (i % 10 = 4) "
        "FROM unnest($2::text[]) WITH ORDINALITY AS x(c, i) "
        "WHERE conv_members.user_id = $1 AND conv_members.conv_id = x.c",
        u,
        mine,
    )
    t = time.monotonic()
    await pg.execute("VACUUM ANALYZE")
    vacuum_s = time.monotonic() - t
    n_msgs = await pg.fetchval("SELECT count(*) FROM messages")
    u_sent = await pg.fetchval("SELECT count(*) FROM messages WHERE sender_id = $1", u)
    mentioning = await pg.fetchval(
        "SELECT count(*) FROM messages WHERE mention_all OR cardinality(mentions) > 0"
    )
    # messages is partitioned (migration 0012): the parent holds no rows of its own
    size = await pg.fetchval(
        "SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits "
        "WHERE inhparent = 'messages'::regclass"
    )
    return {
        "user_id": u,
        "users": n_users,
        "conversations": len(convs),
        "u_conversations": len(mine),
        "u_singles": args.u_singles,
        "u_groups": args.u_groups,
        "messages": int(n_msgs),
        "u_sent_messages": int(u_sent),
        "mentioning_messages": int(mentioning),
        "u_null_cursors": sum(1 for r in u_rows if r[5] is None),
        "messages_size": size,
        "load_s": round(load_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
        "mine": mine,
    }


# --------------------------------------------------------------------------- timing


def per_conv_sql() -> str:
    """One conversation's unread and mention counts, with the very rules of the
    one-statement query (built from the same constants)."""
    return (
        f"SELECT {DIRECT_UNREAD}, {DIRECT_MENTION_UNREAD} FROM conv_members m "
        "JOIN conversations c ON c.conv_id = m.conv_id WHERE m.user_id = :u AND m.conv_id = :c"
    )


def before_sql() -> str:
    """Round one's statement, before mention_unread: unread counts only, each unread
    message counted."""
    return (
        f"SELECT m.conv_id, {DIRECT_UNREAD} AS unread FROM conv_members m JOIN "
        "conversations c ON c.conv_id = m.conv_id WHERE m.user_id = :u ORDER BY m.conv_id"
    )


async def per_conversation(conn: AsyncConnection, u: int) -> tuple[list[tuple[str, int, int]], int]:
    """(conv_id, unread, mention_unread) of each conversation with unread messages, and
    the badge, the slow way (a statement per conversation)."""
    ids = list(
        await conn.execute(
            text("SELECT conv_id, muted FROM conv_members WHERE user_id = :u ORDER BY conv_id"),
            {"u": u},
        )
    )
    q = text(per_conv_sql())
    out = []
    badge = 0
    for cid, muted in ids:
        n, k = (await conn.execute(q, {"u": u, "c": cid})).one()
        if n:
            out.append((str(cid), int(n), int(k)))
            badge += int(k) if muted else int(n)
    return out, badge


async def time_statement(conn: AsyncConnection, sql: str, u: int, runs: int) -> dict[str, float]:
    q = text(sql)
    for _ in range(10):
        await conn.execute(q, {"u": u})
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        list(await conn.execute(q, {"u": u}))
        ms.append((time.perf_counter() - t) * 1000)
    return {
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


async def compare(stores: Stores, args: argparse.Namespace, u: int) -> dict[str, Any]:
    """Round two's statement (each unread message counted, with mention_unread and the
    badge) against the production statement (message_blocks), interleaved in blocks; round
    one's (unread only, counted); then production without the mentions' partial index."""
    engine = create_engine(Settings(database_url=stores.pg.url, redis_url="redis://x"))
    runs = max(10, args.runs // 4)
    got: dict[str, list[dict[str, float]]] = {"round_one": [], "direct": [], "production": []}
    sqls = {
        "round_one": before_sql(),
        "direct": DIRECT_COUNTS,
        "production": conv_store._UNREAD_COUNTS,
    }
    try:
        async with engine.connect() as conn:
            for _ in range(4):
                for name, sql in sqls.items():
                    got[name].append(await time_statement(conn, sql, u, runs))
            await conn.execute(text("DROP INDEX messages_mentions"))
            await conn.commit()
            no_index = await time_statement(conn, conv_store._UNREAD_COUNTS + " -- ni", u, runs)
            await recreate_mentions_index(conn)
            await conn.commit()
    finally:
        await engine.dispose()

    def mid(xs: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(statistics.median(x[k] for x in xs), 2) for k in xs[0]}

    return {
        "round_one_unread_only": mid(got["round_one"]),
        "round_two_direct_counts": mid(got["direct"]),
        "production_blocks": mid(got["production"]),
        "production_without_mention_index": no_index,
        "runs_per_block": runs,
    }


def skeleton_sql() -> str:
    """The production statement without its counts: U's member rows, the join and the
    window sum (what the statement costs besides counting)."""
    return (
        "WITH t AS MATERIALIZED (SELECT m.conv_id, m.muted, 1::bigint AS unread, "
        "0::bigint AS mention_unread FROM conv_members m JOIN conversations c "
        "ON c.conv_id = m.conv_id WHERE m.user_id = :u) "
        "SELECT conv_id, unread, mention_unread, "
        "sum(CASE WHEN muted THEN mention_unread ELSE unread END) OVER () "
        "FROM t WHERE unread > 0 ORDER BY conv_id"
    )


# settings a variant runs under, on the benchmark's connection (RESET after)
_VARIANT_SETTINGS = {
    # JIT as a custom plan past jit_above_cost gets it (the server turns JIT off)
    "jit_forced": [
        "SET jit = on",
        "SET jit_above_cost = 0",
        "SET jit_inline_above_cost = 0",
        "SET jit_optimize_above_cost = 0",
    ],
    # planned at every execution, as the first five executions on each connection are
    "custom_plan_each_time": ["SET plan_cache_mode = force_custom_plan"],
}


async def costs(stores: Stores, args: argparse.Namespace, u: int) -> dict[str, Any]:
    """The production statement (counts + mention_unread + badge) beside variants that
    say where its time goes, interleaved in blocks on one connection: JIT forced, a new
    plan each time, the counts without their per-entry tests (the floor of counting
    entries), and the statement without counts."""
    engine = create_engine(Settings(database_url=stores.pg.url, redis_url="redis://x"))
    runs = max(10, args.runs // 4)
    names = ["production", *_VARIANT_SETTINGS, "direct_count", "no_counts"]
    try:
        async with engine.connect() as conn:
            # a build without LLVM (the embedded one) never compiles: no JIT to time
            jit = bool((await conn.execute(text("SELECT pg_jit_available()"))).scalar())
            if not jit:
                names.remove("jit_forced")
            got: dict[str, list[dict[str, float]]] = {n: [] for n in names}
            for _ in range(4):
                for name in names:
                    sql = {
                        "direct_count": DIRECT_COUNTS,
                        "no_counts": skeleton_sql(),
                    }.get(name, conv_store._UNREAD_COUNTS)
                    # a text of its own: a new prepared statement, planned under the
                    # variant's settings (a cached plan keeps the ones it was made under)
                    sql += f" -- {name}"
                    for stmt in _VARIANT_SETTINGS.get(name, []):
                        await conn.execute(text(stmt))
                    got[name].append(await time_statement(conn, sql, u, runs))
                    await conn.execute(text("RESET ALL"))
            await conn.rollback()
    finally:
        await engine.dispose()
    out: dict[str, Any] = {
        n: {k: round(statistics.median(x[k] for x in xs), 2) for k in xs[0]}
        for n, xs in got.items()
    }
    out["runs_per_block"] = runs
    out["jit_available"] = jit
    return out


async def fresh_rows(
    pg: asyncpg.Connection, stores: Stores, args: argparse.Namespace, u: int, mine: list[str]
) -> dict[str, Any]:
    """``--fresh`` new messages from others in each of U's conversations, inserted after
    the VACUUM: their pages are not all-visible yet, so the index-only scans read the
    table for each of them. The statement is timed (and explained) over them, then again
    once VACUUM has marked them. Last step: it changes the data."""
    per = args.per_conv
    await pg.execute(
        """
        INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, content,
                              server_time, recalled, mentions, mention_all)
        SELECT b.conv_id, $2::int + s, b.senders[1 + s % cardinality(b.senders)],
               b.conv_id || '#f' || s, 'text', '{"text": "fresh"}'::jsonb, s, false,
               '{}'::bigint[], false
          FROM bench_convs b CROSS JOIN generate_series(1, $3::int) s
         WHERE b.conv_id = ANY($1::text[])
        """,
        mine,
        per,
        args.fresh,
    )
    await pg.execute(
        "UPDATE conversations SET max_seq = $2::bigint + $3::bigint, "
        "seq_reserved = $2::bigint + $3::bigint WHERE conv_id = ANY($1::text[])",
        mine,
        per,
        args.fresh,
    )
    engine = create_engine(Settings(database_url=stores.pg.url, redis_url="redis://x"))
    runs = max(10, args.runs // 4)
    out: dict[str, Any] = {"fresh_per_conversation": args.fresh, "rows": args.fresh * len(mine)}
    try:
        for phase in ("before_vacuum", "after_vacuum"):
            if phase == "after_vacuum":
                await pg.execute("VACUUM messages")
            async with engine.connect() as conn:
                timed = [
                    await time_statement(conn, conv_store._UNREAD_COUNTS, u, runs) for _ in range(2)
                ]
                await conn.rollback()
            plan = "\n".join(
                r[0]
                for r in await pg.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS) " + conv_store._UNREAD_COUNTS.replace(":u", "$1"),
                    u,
                )
            )
            f = plan_facts(plan)
            out[phase] = {
                **{k: round(statistics.median(x[k] for x in timed), 2) for k in timed[0]},
                "heap_fetches": f["heap_fetches"],
                "execution_ms": f["execution_ms"],
            }
    finally:
        await engine.dispose()
    return out


async def measure(stores: Stores, args: argparse.Namespace, u: int) -> dict[str, Any]:
    engine = create_engine(Settings(database_url=stores.pg.url, redis_url="redis://x"))
    captured: list[tuple[str, Any]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if "AS mention_unread" in statement and "OVER ()" in statement and not captured:
            captured.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with engine.connect() as conn:
            for _ in range(args.warmup):
                counted = await conv_store.unread(conn, u)
                base, base_badge = await per_conversation(conn, u)
            one = counted.rows
            if sorted(one) != sorted(base) or counted.badge != base_badge:
                raise AssertionError(
                    f"the two ways disagree: {one[:5]} vs {base[:5]}, "
                    f"badge {counted.badge} vs {base_badge}"
                )
            single: list[float] = []
            per_user: list[float] = []
            block = max(1, args.runs // max(1, args.baseline_rounds))
            while len(single) < args.runs or len(per_user) < args.baseline_rounds:
                for _ in range(min(block, args.runs - len(single))):
                    t = time.perf_counter()
                    await conv_store.unread(conn, u)
                    single.append(time.perf_counter() - t)
                if len(per_user) < args.baseline_rounds:
                    t = time.perf_counter()
                    await per_conversation(conn, u)
                    per_user.append(time.perf_counter() - t)
    finally:
        await engine.dispose()
    ms = [x * 1000 for x in single]
    bms = [x * 1000 for x in per_user]
    return {
        "one_statement": {
            "runs": len(ms),
            "p50_ms": round(pct(ms, 50), 2),
            "p95_ms": round(pct(ms, 95), 2),
            "p99_ms": round(pct(ms, 99), 2),
            "mean_ms": round(statistics.fmean(ms), 2),
        },
        "per_conversation": {
            "rounds": len(bms),
            "statements_per_user": 1 + int(args.u_singles + args.u_groups),
            "p50_ms": round(pct(bms, 50), 2),
            "p99_ms": round(pct(bms, 99), 2),
            "mean_ms": round(statistics.fmean(bms), 2),
        },
        "ratio_per_conversation_over_one_statement": round(
            statistics.fmean(bms) / statistics.fmean(ms), 2
        ),
        "ratio_p50": round(pct(bms, 50) / pct(ms, 50), 2),
        "unread_conversations": len(one),
        "unread_total": sum(n for _, n, _ in one),
        "mention_unread_total": sum(k for _, _, k in one),
        "badge": counted.badge,
        "captured_sql": captured[0][0] if captured else None,
        "captured_params": list(captured[0][1]) if captured else None,
    }


# --------------------------------------------------------------------------- explain


async def explain(pg: asyncpg.Connection, sql: str, params: list[Any]) -> dict[str, str]:
    out = {}
    for mode in ("auto", "force_generic_plan"):
        await pg.execute(f"SET plan_cache_mode = {mode}")
        rows = await pg.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *params)
        out[mode] = "\n".join(r[0] for r in rows)
    await pg.execute("RESET plan_cache_mode")
    return out


async def recreate_mentions_index(conn: AsyncConnection) -> None:
    """messages_mentions again, as migration 0012 builds it: on the parent only, then one
    per partition named after it, attached."""
    cols = (
        "(conv_id, seq) INCLUDE (sender_id, content_type, mention_all, mentions) "
        "WHERE mention_all OR cardinality(mentions) > 0"
    )
    await conn.execute(text(f"CREATE INDEX messages_mentions ON ONLY messages {cols}"))
    parts = await conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'messages'::regclass ORDER BY 1"
        )
    )
    for (p,) in parts.all():
        await conn.execute(text(f"CREATE INDEX {p}_mentions ON {p} {cols}"))
        await conn.execute(text(f"ALTER INDEX messages_mentions ATTACH PARTITION {p}_mentions"))


def plan_facts(plan: str) -> dict[str, Any]:
    def rows_of(pattern: str) -> tuple[int, float]:
        n, total = 0, 0.0
        for m in re.finditer(
            pattern + r".*?actual time=[\d.]+\.\.[\d.]+ rows=([\d.]+) loops=(\d+)", plan
        ):
            n += 1
            total += float(m.group(1)) * int(m.group(2))
        return n, total

    # messages is partitioned (migration 0012): a plan names the partitions' indexes,
    # messages_p03_pkey and so on
    ios_pkey = rows_of(r"Index Only Scan(?: Backward)? using messages(?:_p\d\d)?_pkey")
    ios_sender = rows_of(r"Index Only Scan(?: Backward)? using messages(?:_p\d\d)?_sender")
    ios_mentions = rows_of(r"Index Only Scan(?: Backward)? using messages(?:_p\d\d)?_mentions")
    heap = sum(int(x) for x in re.findall(r"Heap Fetches: (\d+)", plan))
    first_buf = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    exec_ms = re.search(r"Execution Time: ([\d.]+) ms", plan)
    return {
        "seq_scans_on_messages": len(re.findall(r"Seq Scan on messages", plan)),
        "seq_scan_on_conversations_rows": sum(
            int(float(m.group(1)))
            for m in re.finditer(r"Seq Scan on conversations.*?actual time=\S+ rows=([\d.]+)", plan)
        ),
        "plain_index_scans_on_messages": len(
            re.findall(r"(?<!Only )Index Scan(?: Backward)? using messages_\w+ on messages", plan)
        ),
        "bitmap_heap_scans_on_messages": len(re.findall(r"Bitmap Heap Scan on messages", plan)),
        "index_only_pkey_nodes": ios_pkey[0],
        "index_only_pkey_rows": int(ios_pkey[1]),
        "index_only_mentions_nodes": ios_mentions[0],
        "index_only_mentions_rows": int(ios_mentions[1]),
        "index_only_sender_nodes": ios_sender[0],
        "index_only_sender_rows": int(ios_sender[1]),
        "uses_conv_members_user": "conv_members_user" in plan,
        # partitions some scan of the execution read (pruned ones show "never executed")
        "partitions_read": len(set(re.findall(r" on (messages_p\d\d)\b[^\n]*actual time=", plan))),
        "heap_fetches": heap,
        "shared_hit": int(first_buf.group(1)) if first_buf else None,
        "shared_read": int(first_buf.group(2) or 0) if first_buf else None,
        "execution_ms": float(exec_ms.group(1)) if exec_ms else None,
    }


def plan_parts(plan: str) -> dict[str, float | None]:
    """Where EXPLAIN ANALYZE says the statement's time goes (ms, summed over loops): the
    block edges (index-only scans of the primary key), my own messages after my cursor
    (``messages_sender``), the mention_unread count (the partial index), the cursor
    fallback (U's last sent seq, ``messages_sender``), the rest (member rows, join, the
    block sums, window sum, sort), and planning.
    EXPLAIN's own timing makes the counts look slower than they run."""
    lines = plan.splitlines()
    unread = mention = fallback = own = 0.0
    timed = re.compile(r"actual time=[\d.]+\.\.([\d.]+) rows=[\d.]+ loops=(\d+)")
    for i, line in enumerate(lines):
        head = re.match(r"(\s*)(SubPlan|InitPlan) \d+", line)
        if not head or i + 1 >= len(lines):
            continue
        m = timed.search(lines[i + 1])
        if not m:
            continue
        total = float(m.group(1)) * int(m.group(2))
        depth = len(head.group(1))
        body = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= depth:
                break
            body.append(nxt)
        text_ = "\n".join(body)
        if head.group(2) == "InitPlan" and "_sender" in text_ and "Result" in lines[i + 1]:
            fallback += total
        elif head.group(2) == "SubPlan" and "Aggregate" in lines[i + 1]:
            if "_mentions" in text_:
                mention += total
            elif "_pkey" in text_:
                unread += total
            elif "_sender" in text_:
                own += total
    ex = re.search(r"Execution Time: ([\d.]+) ms", plan)
    pl = re.search(r"Planning Time: ([\d.]+) ms", plan)
    execution = float(ex.group(1)) if ex else None
    return {
        "unread_count_ms": round(unread, 2),
        "own_count_ms": round(own, 2),
        "mention_count_ms": round(mention, 2),
        "cursor_fallback_ms": round(fallback, 2),
        "rest_ms": (
            round(execution - unread - own - mention, 2) if execution is not None else None
        ),
        "execution_ms": execution,
        "planning_ms": float(pl.group(1)) if pl else None,
    }


def reading(f: dict[str, Any], data: dict[str, Any]) -> list[str]:
    lines = []
    problems = (
        f["seq_scans_on_messages"]
        + f["plain_index_scans_on_messages"]
        + f["bitmap_heap_scans_on_messages"]
    )
    if problems:
        lines.append(
            f"**Problem:** messages is read through {f['seq_scans_on_messages']} seq scan(s), "
            f"{f['plain_index_scans_on_messages']} plain index scan(s) and "
            f"{f['bitmap_heap_scans_on_messages']} bitmap heap scan(s): the count leaves the index."
        )
    else:
        lines.append(
            "messages is only ever read through index-only scans: no seq scan, no plain index "
            "scan, no bitmap heap scan on it."
        )
    lines.append(
        "The unread counts sum `message_blocks` (countable messages per 64 seqs) from the "
        "cursor's block on, corrected by the countable messages between the cursor and the "
        "nearer end of its block: an "
        f"index-only range scan of `messages_pkey` of at most half a block "
        f"({f['index_only_pkey_rows']:,} index rows for {data['u_conversations']} "
        "conversations, where counting every unread message read as many rows as there are "
        "unread messages). My own messages after my cursor come off, counted index-only on "
        "`messages_sender` (which includes content_type) and only where I have a cursor; the "
        "end's block only where my window has an end; the mentions only where the blocks "
        "hold one."
    )
    lines.append(
        f"The COALESCE fallback (no read cursor) is a backward index-only scan of "
        f"`messages_sender` with LIMIT 1 semantics ({f['index_only_sender_rows']:,} rows over "
        f"its loops), run only for the {data['u_null_cursors']} conversations whose cursor is "
        "NULL; U's member rows come from `conv_members_user`"
        + (" (used)." if f["uses_conv_members_user"] else " (**not used** in this plan).")
    )
    if f["seq_scan_on_conversations_rows"]:
        lines.append(
            f"`conversations` is joined by hashing a seq scan of all its "
            f"{f['seq_scan_on_conversations_rows']:,} rows: the cheapest way for a table this "
            "small, but one that grows with every conversation in the database. The planner "
            "drops it by itself: with `--convs 60000 --per-conv 10` the same query becomes a "
            "nested loop of 200 probes of `conversations_pkey` (checked once, 1.7 ms)."
        )
    else:
        lines.append("`conversations` is probed through `conversations_pkey` (nested loop).")
    heavy = f["heap_fetches"] > f["index_only_pkey_rows"] * 0.1
    lines.append(
        f"Heap fetches: {f['heap_fetches']:,}"
        + (" -- **they dominate**: the visibility map is not set" if heavy else "")
        + f"; buffers: {f['shared_hit']:,} hit, {f['shared_read']:,} read; execution "
        f"{f['execution_ms']} ms. VACUUM set the visibility map, so the scans never visit the "
        "table. Rows inserted since the last (auto)vacuum cost one heap visit each (seen in a smaller "
        "trial run, 60,000 messages, before the visibility map was set: the same plan made "
        "12,667 heap fetches for 11,932 counted rows), so autovacuum must keep up with messages."
    )
    return lines


def write_doc(res: dict[str, Any], plans: dict[str, str], facts: dict[str, Any]) -> None:
    ddl = MIGRATION.read_text()
    wanted = ("messages_pkey", "messages_sender", "conv_members_user")
    idx = [line.strip().rstrip(",") for line in ddl.splitlines() if any(w in line for w in wanted)]
    idx.append(
        "-- migrations/versions/0012: messages PARTITION BY HASH (conv_id), 16 partitions "
        "messages_p00..messages_p15; each holds these indexes as messages_pNN_pkey, "
        "messages_pNN_sender, messages_pNN_mentions"
    )
    idx.append("-- conversations: conv_id TEXT PRIMARY KEY (conversations_pkey)")
    idx.append(
        "-- migrations/versions/0021: message_blocks (conv_id, blk, countable, mentioning), "
        "PRIMARY KEY (conv_id, blk), kept by statement triggers on messages; messages_sender "
        "built again as (conv_id, sender_id, seq) INCLUDE (content_type)"
    )
    idx.append(
        "-- migrations/versions/0004: CREATE INDEX messages_mentions ON messages (conv_id, seq) "
        "INCLUDE (sender_id, content_type, mention_all, mentions) "
        "WHERE mention_all OR cardinality(mentions) > 0"
    )
    d, t = res["data"], res["timing"]
    same = (
        "yes"
        if plans["auto"].split("Planning")[0].count("->")
        == plans["force_generic_plan"].split("Planning")[0].count("->")
        else "no"
    )
    text_ = (
        f"""# The unread query: EXPLAIN (ANALYZE, BUFFERS)

Generated by `./scripts/bench unread_query` (see `docs/performance.md`,
section "Unread query", for the timings). Machine: {res["machine"]["cpus"]} cores, shared and noisy.

Data: {d["messages"]:,} messages in {d["conversations"]} conversations ({d["messages_size"]} with
indexes); user U = {d["user_id"]} is in {d["u_conversations"]} of them ({d["u_singles"]} single
chats, {d["u_groups"]} groups), has sent {d["u_sent_messages"]:,} messages, and has no read cursor
in {d["u_null_cursors"]} (the fallback to U's last sent seq). VACUUM ANALYZE after the load.
Result: {t["unread_conversations"]} conversations with unread messages, {t["unread_total"]:,} unread in all.

## The query

`im_server.storage.conv_store.unread_counts(conn, user_id)`, captured as sent by
SQLAlchemy/asyncpg (`$1` = the user id):

```sql
{res["timing"]["captured_sql"].strip()}
```

## The indexes it relies on (migrations/versions/0001_initial.py)

```sql
{chr(10).join(idx)}
```

- `message_blocks_pkey (conv_id, blk)`: the countable and mentioning messages of each
  block of 64 seqs from the cursor's block (or the next) on, summed.
- `messages_pkey (conv_id, seq) INCLUDE (sender_id, content_type)`: the countable
  messages between the cursor and the nearer end of its block (half a block at most),
  with the type filter
  answered from the index tuples (index-only).
- `messages_sender (conv_id, sender_id, seq) INCLUDE (content_type)`: my own countable
  messages after my cursor, and "my last sent seq here", the fallback when I have no
  read cursor (backward scan, first row).
- `conv_members_user (user_id, conv_id)`: my conversations.

## Plan (custom plan for this user, as the first executions get)

```
{plans["auto"]}
```

## Plan with plan_cache_mode = force_generic_plan

A prepared statement (asyncpg prepares and caches them) may switch to the generic plan
after five executions. Same node count as the custom plan: {same}.

```
{plans["force_generic_plan"]}
```

## Reading the plan

"""
        + "\n".join(f"- {x}" for x in reading(facts, d))
        + "\n"
    )
    EXPLAIN_DOC.parent.mkdir(parents=True, exist_ok=True)
    EXPLAIN_DOC.write_text(text_)


# --------------------------------------------------------------------------- main


async def bench(stores: Stores, args: argparse.Namespace) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)
    dsn = stores.pg.url.replace("postgresql+asyncpg", "postgresql")
    pg = await asyncpg.connect(dsn, command_timeout=600)
    try:
        t = time.monotonic()
        data = await build(pg, args)
        data["setup_s"] = round(time.monotonic() - t, 1)
        if not args.json:
            print(
                f"data: {data['messages']:,} messages in {data['conversations']} conversations, "
                f"U in {data['u_conversations']}; load {data['load_s']} s, "
                f"VACUUM ANALYZE {data['vacuum_analyze_s']} s",
                file=sys.stderr,
            )
        timing = await measure(stores, args, data["user_id"])
        plans = await explain(pg, timing["captured_sql"], timing["captured_params"])
        timing["mentions"] = await compare(stores, args, data["user_id"])
        timing["costs"] = await costs(stores, args, data["user_id"])
        if args.fresh:
            timing["fresh"] = await fresh_rows(pg, stores, args, data["user_id"], data["mine"])
    finally:
        await pg.close()
    data.pop("mine")
    facts = plan_facts(plans["auto"])
    res = {
        "benchmark": "unread_query",
        "machine": {
            "cpus": os.cpu_count(),
            "note": "shared, noisy",
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "params": {
            "convs": args.convs,
            "per_conv": args.per_conv,
            "runs": args.runs,
            "warmup": args.warmup,
            "baseline_rounds": args.baseline_rounds,
            "fsync": False,
        },
        "data": data,
        "timing": timing,
        "plan": facts,
        "plan_generic": plan_facts(plans["force_generic_plan"]),
        "plan_parts": plan_parts(plans["auto"]),
    }
    if args.explain_doc:
        write_doc(res, plans, facts)
    res["plan_text"] = plans["auto"]
    timing.pop("captured_params", None)
    return res


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t, d, f = res["timing"], res["data"], res["plan"]
    o, b = t["one_statement"], t["per_conversation"]
    tab = Table(
        title=f"Unread counts of one user in {d['u_conversations']} conversations, "
        f"{d['messages']:,} messages, {res['machine']['cpus']} CPUs (shared, "
        f"load {res['machine']['loadavg_1m_start']})"
    )
    tab.add_column("")
    tab.add_column("one statement (production)", justify="right")
    tab.add_column("per conversation (1 + N COUNTs)", justify="right")
    tab.add_row("statements per user", "1", str(b["statements_per_user"]))
    tab.add_row("runs", str(o["runs"]), str(b["rounds"]))
    tab.add_row("p50", f"{o['p50_ms']} ms", f"{b['p50_ms']} ms")
    tab.add_row("p95", f"{o['p95_ms']} ms", "")
    tab.add_row("p99", f"{o['p99_ms']} ms", f"{b['p99_ms']} ms")
    tab.add_row("mean", f"{o['mean_ms']} ms", f"{b['mean_ms']} ms")
    console = Console()
    console.print(tab)
    console.print(
        f"ratio per-conversation / one statement: mean {t['ratio_per_conversation_over_one_statement']}x, "
        f"p50 {t['ratio_p50']}x; {t['unread_conversations']} conversations unread, "
        f"{t['unread_total']:,} messages"
    )
    console.print(
        f"plan: seq scans on messages {f['seq_scans_on_messages']}, index-only rows "
        f"{f['index_only_pkey_rows']:,} (pkey) + {f['index_only_sender_rows']:,} (sender), heap fetches "
        f"{f['heap_fetches']:,}, buffers hit {f['shared_hit']:,} read {f['shared_read']:,}, "
        f"execution {f['execution_ms']} ms, messages partitions read {f['partitions_read']}"
        + (f"; written to {EXPLAIN_DOC.relative_to(ROOT)}" if res.get("doc") else "")
    )
    mt = t["mentions"]

    def fig(k: str) -> str:
        return f"{mt[k]['p50_ms']}/{mt[k]['p95_ms']}/{mt[k]['p99_ms']} ms"

    console.print(
        f"mention_unread: {t['mention_unread_total']:,} mentions unread; index-only rows of "
        f"messages_mentions {f['index_only_mentions_rows']:,}. p50/p95/p99 (interleaved): "
        f"production (blocks) {fig('production_blocks')}; round two's statement (each unread "
        f"message counted) {fig('round_two_direct_counts')}; round one's (unread only, "
        f"counted) {fig('round_one_unread_only')}; production without messages_mentions "
        f"{fig('production_without_mention_index')}"
    )
    c = t["costs"]
    ct = Table(title="Where the statement's time goes (same run, interleaved blocks)")
    for col in ("variant", "p50", "p95", "p99", "mean"):
        ct.add_column(col, justify="left" if col == "variant" else "right")
    labels = {
        "production": "production: counts + mention_unread + badge (cached plan)",
        "jit_forced": "the same with JIT forced (jit_above_cost = 0)",
        "custom_plan_each_time": "the same planned at every execution",
        "direct_count": "round two's statement: each unread message counted",
        "no_counts": "no counts: member rows, join, badge sum",
    }
    for k, label in labels.items():
        if k not in c:
            continue
        v = c[k]
        ct.add_row(label, *(f"{v[x]} ms" for x in ("p50_ms", "p95_ms", "p99_ms", "mean_ms")))
    console.print(ct)
    if not c["jit_available"]:
        console.print("JIT: not available in this PostgreSQL build (pg_jit_available() false)")
    pp = res["plan_parts"]
    console.print(
        f"EXPLAIN ANALYZE parts (custom plan, EXPLAIN's timing overhead included): unread "
        f"block edges {pp['unread_count_ms']} ms, own messages {pp['own_count_ms']} ms, cursor "
        f"fallback {pp['cursor_fallback_ms']} ms, mention count {pp['mention_count_ms']} ms, "
        f"rest {pp['rest_ms']} ms; execution "
        f"{pp['execution_ms']} ms, planning {pp['planning_ms']} ms"
    )
    if "fresh" in t:
        fr = t["fresh"]
        bv, av = fr["before_vacuum"], fr["after_vacuum"]
        console.print(
            f"{fr['rows']:,} fresh rows ({fr['fresh_per_conversation']} per conversation) not yet "
            f"vacuumed: p50/p95/p99 {bv['p50_ms']}/{bv['p95_ms']}/{bv['p99_ms']} ms, "
            f"{bv['heap_fetches']:,} heap fetches; after VACUUM {av['p50_ms']}/{av['p95_ms']}/"
            f"{av['p99_ms']} ms, {av['heap_fetches']:,} heap fetches"
        )
    console.print(f"badge {t['badge']:,}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench unread_query", description=__doc__.split("\n\n")[0]
    )
    add_layout_args(ap)
    ap.add_argument("--runs", type=int, default=200, help="timed runs of the one statement")
    ap.add_argument("--warmup", type=int, default=10, help="untimed runs of both ways first")
    ap.add_argument("--baseline-rounds", type=int, default=20, help="timed per-conversation rounds")
    ap.add_argument(
        "--fresh",
        type=int,
        default=100,
        help="new messages per conversation of U inserted after the VACUUM, timed before and "
        "after a VACUUM marks them (0: skip)",
    )
    ap.add_argument(
        "--no-explain-doc",
        dest="explain_doc",
        action="store_false",
        help=f"do not (re)write {EXPLAIN_DOC.relative_to(ROOT)}",
    )
    ap.add_argument(
        "--plan-out", help="write the custom plan (EXPLAIN ANALYZE, BUFFERS) to this file"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    check_layout_args(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run_with_stores("im-unread-query-", lambda stores: bench(stores, args))
    res["doc"] = bool(args.explain_doc)
    plan_text = res.pop("plan_text")
    if args.plan_out:
        Path(args.plan_out).write_text(plan_text + "\n")
    report(res, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
