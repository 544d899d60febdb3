"""Search at scale: one user in 200 conversations, ~1,000,000 messages.

    ./scripts/bench search [--convs 1000] [--per-conv 1000] [--runs 40] [--json]

Times the production path, ``im_server.storage.search.find(conn, U, parts(q), 21)``
(one statement: U's windows, then per conversation a scan of the GIN index on
``(conv_id, search)``, newest first, a page of 20 plus one), through a SQLAlchemy
AsyncEngine made by ``im_server.storage.db.create_engine``, for Latin and CJK queries
from very common to rare, each run ``--runs`` times, interleaved. Baseline in the same
run: the same search without the index (a substring scan, ``strpos`` over the folded text
of U's visible messages, which is what a search without tokens would do), a few rounds
per query. Also: the index's size and the ``search`` column's size per million messages,
and the persister's rows/s with and without search: ``persist_batch`` (the production
statement) on batches of ``--batch`` new messages, alternating rounds where the messages
get their tokens (Python tokenizer + GIN entries) and rounds where they get none (the
column left NULL: the partial index holds no entry for them, so nothing is indexed).

It starts its own PostgreSQL and Redis (embedded, temp folder, fsync off: only the bulk
load writes much) and stops them at the end, also on error.

Data: ``--convs`` conversations of ``--per-conv`` messages each; U is in ``--u-singles``
single chats and ``--u-groups`` groups (default 150 + 50), a tenth of them with a window
starting at 300 (cleared / joined late), a few groups with one ending at 800 (left); 1 %
of the messages are recalled. Text: 70 % of the messages are Latin, 4 to 14 words drawn
with a Zipf law (s = 1) from 5,000 made-up words (the commonest in about half of the
messages, like "the"); 30 % are Chinese, 6 to 30 characters drawn with a Zipf law from
3,000 ideographs. The queries are picked by rank from the same laws, so their number of
matches is known (printed). Before timing, three pages of each query are checked against
a plain statement that sorts every match (same messages, same order).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import time
import zlib
from typing import Any

import asyncpg
import orjson
from sqlalchemy import text

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
from im_server.search_text import message_document, parts, query
from im_server.storage import messages as msg_store
from im_server.storage import search as search_store
from im_server.storage.db import create_engine
from im_server.storage.messages import NewMessage

PARTITIONS = 16
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


class Corpus:
    """The made-up languages: words and ideographs ranked by frequency (Zipf, s = 1)."""

    def __init__(self, seed: int = 11) -> None:
        rnd = random.Random(seed)
        words: list[str] = []
        seen: set[str] = set()
        while len(words) < 5000:
            w = "".join(rnd.choice(SYLLABLES) for _ in range(rnd.choice((1, 2, 2, 3, 3, 4))))
            if w not in seen and len(w) >= 3:
                seen.add(w)
                words.append(w)
        self.words = words
        ideographs = rnd.sample(range(0x4E00, 0x9FA5), 3000)
        self.hanzi = [chr(c) for c in ideographs]
        self._wcum = list(itertools.accumulate(1 / r for r in range(1, len(words) + 1)))
        self._hcum = list(itertools.accumulate(1 / r for r in range(1, len(self.hanzi) + 1)))

    def latin(self, rnd: random.Random) -> str:
        n = rnd.randint(4, 14)
        ws = rnd.choices(self.words, cum_weights=self._wcum, k=n)
        ws[0] = ws[0].capitalize()
        return " ".join(ws) + rnd.choice((".", "!", "?", ""))

    def chinese(self, rnd: random.Random) -> str:
        n = rnd.randint(6, 30)
        cs = rnd.choices(self.hanzi, cum_weights=self._hcum, k=n)
        if n > 12:
            cs.insert(n // 2, "，")
        return "".join(cs) + "。"

    def text(self, rnd: random.Random) -> str:
        return self.chinese(rnd) if rnd.random() < 0.3 else self.latin(rnd)


def queries(c: Corpus, sample_cn: str) -> list[tuple[str, str, str]]:
    """(script, label, q): picked by rank, plus substrings of a stored Chinese text."""
    w, h = c.words, c.hanzi
    run = max(sample_cn.split("，"), key=len).rstrip("。")
    return [
        ("latin", "word rank 1 (in ~half the messages)", w[0]),
        ("latin", "word rank 10", w[9]),
        ("latin", "word rank 100", w[99]),
        ("latin", "word rank 1000", w[999]),
        ("latin", "word rank 4000 (rare)", w[3999]),
        ("latin", "prefix: first 3 letters of rank 50", w[49][:3]),
        ("latin", "two words, ranks 20 and 300", f"{w[19]} {w[299]}"),
        ("latin", "word not in any message", "zzyzx"),
        ("latin", "1 letter and a word in no message", f"{w[0][0]} zzyzx"),
        ("latin", "7 one-letter words and a word in no message", "b d f g h k zzyzx"),
        ("cjk", "2 chars, ranks 1+2", h[0] + h[1]),
        ("cjk", "2 chars, ranks 30+60", h[29] + h[59]),
        ("cjk", "2 chars, ranks 500+900 (rare)", h[499] + h[899]),
        ("cjk", "1 char, rank 1", h[0]),
        ("cjk", "3 chars of a stored message", run[1:4]),
        ("cjk", "5 chars of a stored message", run[:5]),
    ]


# --------------------------------------------------------------------------- data


async def build(pg: asyncpg.Connection, args: argparse.Namespace, corpus: Corpus) -> dict[str, Any]:
    rnd = random.Random(7)
    await pg.execute("SET synchronous_commit = on")  # VACUUM can set the visibility map
    layout = await user_in_conversations(
        pg,
        rnd,
        convs=args.convs,
        u_singles=args.u_singles,
        u_groups=args.u_groups,
        per_conv=args.per_conv,
        prefix="sq",
    )
    u, convs, members, mine = layout.user_id, layout.convs, layout.members, layout.mine
    now = int(time.time() * 1000)
    per = args.per_conv
    rows = []
    for i, cid in enumerate(mine):
        min_seq = 300 if i % 10 == 1 else 1
        max_seq = 800 if cid.startswith("g:") and i % 25 == 3 else None
        rows.append((cid, u, min_seq, max_seq, now))
    rows += [(cid, m, 1, None, now) for cid, ms in members.items() for m in ms if m != u]
    await pg.copy_records_to_table(
        "conv_members",
        records=rows,
        columns=["conv_id", "user_id", "min_seq", "max_seq", "joined_at"],
    )

    # the messages, made here (the tokens come from the production tokenizer), copied
    # into a staging table, then moved in with the index built afterwards (a restore)
    await pg.execute(
        "CREATE TEMP TABLE stage (conv_id text, seq bigint, sender_id bigint, "
        "client_msg_id text, content text, server_time bigint, recalled boolean, search text)"
    )
    await pg.execute("DROP INDEX messages_search")
    await pg.execute("DROP INDEX messages_search_time")
    t = time.monotonic()
    make_s = 0.0
    sample_cn = ""
    total = 0
    for chunk_start in range(0, len(convs), 50):
        m0 = time.monotonic()
        recs = []
        for cid, _, _ in convs[chunk_start : chunk_start + 50]:
            senders = members[cid]
            for s in range(1, per + 1):
                body = corpus.text(rnd)
                recalled = rnd.random() < 0.01
                content = orjson.dumps({"text": body}).decode()
                doc = None if recalled else message_document(content)
                if not sample_cn and "，" in body and cid in mine:
                    sample_cn = body
                recs.append(
                    (
                        cid,
                        s,
                        senders[(s * 7919) % len(senders)],
                        f"{cid}#{s}",
                        None if recalled else content,
                        now - (per - s) * 60_000 + zlib.crc32(cid.encode()) % 50_000,
                        recalled,
                        doc,
                    )
                )
        make_s += time.monotonic() - m0
        total += len(recs)
        await pg.copy_records_to_table("stage", records=recs)
        await pg.execute(
            "INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, "
            "content, server_time, recalled, search) SELECT conv_id, seq, sender_id, "
            "client_msg_id, 'text', content::jsonb, server_time, recalled, search::tsvector "
            "FROM stage"
        )
        await pg.execute("TRUNCATE stage")
        if not args.json:
            print(f"\rloaded {total:,} messages", end="", file=sys.stderr)
    load_s = time.monotonic() - t
    t = time.monotonic()
    await pg.execute("SET maintenance_work_mem = '256MB'")
    await create_search_index(pg, args.fastupdate)
    index_s = time.monotonic() - t
    t = time.monotonic()
    await pg.execute("VACUUM ANALYZE")
    vacuum_s = time.monotonic() - t
    n_msgs = await pg.fetchval("SELECT count(*) FROM messages")
    visible = await pg.fetchval(
        "SELECT count(*) FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id "
        "JOIN messages x ON x.conv_id = m.conv_id AND x.seq BETWEEN GREATEST(c.min_seq, m.min_seq) "
        "AND LEAST(c.max_seq, COALESCE(m.max_seq, c.max_seq)) WHERE m.user_id = $1 "
        "AND NOT x.recalled",
        u,
    )
    index_bytes = await pg.fetchval(
        "SELECT sum(pg_relation_size(c.oid))::bigint FROM pg_class c "
        "WHERE c.relname ~ '^messages_p\\d\\d_search$'"
    )
    time_index_bytes = await pg.fetchval(
        "SELECT sum(pg_relation_size(c.oid))::bigint FROM pg_class c "
        "WHERE c.relname ~ '^messages_p\\d\\d_search_time$'"
    )
    column_bytes = await pg.fetchval("SELECT sum(pg_column_size(search))::bigint FROM messages")
    table_bytes = await pg.fetchval(
        "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
        "WHERE c.relname ~ '^messages_p\\d\\d$'"
    )
    if not args.json:
        print(file=sys.stderr)
    return {
        "user_id": u,
        "conversations": len(convs),
        "u_conversations": len(mine),
        "messages": int(n_msgs),
        "u_visible_messages": int(visible),
        "load_s": round(load_s, 1),
        "make_and_tokenize_s": round(make_s, 1),
        "index_build_s": round(index_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
        "index_mb": round(index_bytes / 2**20, 1),
        "index_mb_per_million": round(index_bytes / 2**20 / n_msgs * 1e6, 1),
        "time_index_mb_per_million": round(time_index_bytes / 2**20 / n_msgs * 1e6, 1),
        "column_mb_per_million": round(column_bytes / 2**20 / n_msgs * 1e6, 1),
        "messages_total_mb": round(table_bytes / 2**20, 1),
        "sample_cn": sample_cn,
        "mine": mine,
    }


async def create_search_index(pg: asyncpg.Connection, fastupdate: str) -> None:
    """messages_search as migration 0015 builds it: on the parent only, one per partition
    (``fastupdate``: as built, or on with a pending list of that many kB, to compare)."""
    opts = (
        "fastupdate = off"
        if fastupdate == "off"
        else f"fastupdate = on, gin_pending_list_limit = {int(fastupdate)}"
    )
    cols = f"USING gin (conv_id, search) WITH ({opts}) WHERE search IS NOT NULL"
    await pg.execute(f"CREATE INDEX messages_search ON ONLY messages {cols}")
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        await pg.execute(f"CREATE INDEX {p}_search ON {p} {cols}")
        await pg.execute(f"ALTER INDEX messages_search ATTACH PARTITION {p}_search")
    tcols = "(conv_id, server_time, seq) WHERE search IS NOT NULL"
    await pg.execute(f"CREATE INDEX messages_search_time ON ONLY messages {tcols}")
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        await pg.execute(f"CREATE INDEX {p}_search_time ON {p} {tcols}")
        await pg.execute(f"ALTER INDEX messages_search_time ATTACH PARTITION {p}_search_time")


# --------------------------------------------------------------------------- search timing

_BASELINE = """
WITH w AS MATERIALIZED (
    SELECT m.conv_id, GREATEST(c.min_seq, m.min_seq) AS lo,
           LEAST(c.max_seq, COALESCE(m.max_seq, 9223372036854775807)) AS hi
      FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id WHERE m.user_id = :u
)
SELECT x.conv_id, x.seq, x.server_time FROM w JOIN messages x
    ON x.conv_id = w.conv_id AND x.seq BETWEEN w.lo AND w.hi
 WHERE NOT x.recalled AND strpos(lower(x.content ->> 'text'), :q) > 0
 ORDER BY x.server_time DESC, x.conv_id DESC, x.seq DESC LIMIT 21
"""


async def time_search(
    stores: Stores, args: argparse.Namespace, u: int, qs: list[tuple[str, str, str]]
) -> dict[str, Any]:
    engine = create_engine(Settings(database_url=stores.pg.url, redis_url="redis://x"))
    out: dict[str, Any] = {}
    try:
        async with engine.connect() as conn:
            tq = {q: query(q) for _, _, q in qs}
            matches = {}
            for _, _, q in qs:
                r = await conn.execute(
                    text(
                        "SELECT count(*) FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id "
                        "JOIN messages x ON x.conv_id = m.conv_id AND x.seq BETWEEN "
                        "GREATEST(c.min_seq, m.min_seq) AND LEAST(c.max_seq, COALESCE(m.max_seq, c.max_seq)) "
                        "WHERE m.user_id = :u AND NOT x.recalled AND x.search @@ CAST(:q AS tsquery)"
                    ),
                    {"u": u, "q": tq[q]},
                )
                matches[q] = int(r.scalar_one())
            for _, label, q in qs:
                await check_exact(conn, u, q, label)
            for _ in range(3):  # warm-up
                for _, _, q in qs:
                    await search_store.find(conn, u, parts(q), 21)
            times: dict[str, list[float]] = {q: [] for _, _, q in qs}
            pages2: list[float] = []
            for _ in range(args.runs):
                for _, _, q in qs:
                    t = time.perf_counter()
                    found = await search_store.find(conn, u, parts(q), 21)
                    times[q].append((time.perf_counter() - t) * 1000)
                    if len(found) == 21:  # the next page, from the cursor
                        last = found[19]
                        pos = search_store.Position(
                            last["server_time"], last["conv_id"], last["seq"]
                        )
                        t = time.perf_counter()
                        await search_store.find(conn, u, parts(q), 21, before=pos)
                        pages2.append((time.perf_counter() - t) * 1000)
            base: dict[str, list[float]] = {q: [] for _, _, q in qs}
            for _ in range(args.baseline_rounds):
                for script, _, q in qs:
                    if script == "cjk" or " " not in q:
                        t = time.perf_counter()
                        await conn.execute(text(_BASELINE), {"u": u, "q": q})
                        base[q].append((time.perf_counter() - t) * 1000)
            plans = await explain(conn, u, str(tq[qs[0][2]]), str(tq[qs[4][2]]))
    finally:
        await engine.dispose()
    rows = []
    for script, label, q in qs:
        ms = times[q]
        b = base[q]
        rows.append(
            {
                "script": script,
                "query": label,
                "q": q,
                "matches": matches[q],
                "p50_ms": round(pct(ms, 50), 2),
                "p99_ms": round(pct(ms, 99), 2),
                "baseline_p50_ms": round(pct(b, 50), 1) if b else None,
            }
        )
    for script in ("latin", "cjk"):
        allms = [x for s, _, q in qs if s == script for x in times[q]]
        out[script] = {
            "runs": len(allms),
            "p50_ms": round(pct(allms, 50), 2),
            "p99_ms": round(pct(allms, 99), 2),
        }
    allb = [x for xs in base.values() for x in xs]
    out["baseline_p50_ms"] = round(pct(allb, 50), 1) if allb else None
    out["second_page"] = (
        {
            "runs": len(pages2),
            "p50_ms": round(pct(pages2, 50), 2),
            "p99_ms": round(pct(pages2, 99), 2),
        }
        if pages2
        else None
    )
    out["queries"] = rows
    out["plans"] = plans
    return out


_ALL_MATCHES = """
WITH w AS MATERIALIZED (
    SELECT m.conv_id, GREATEST(c.min_seq, m.min_seq) AS lo,
           LEAST(c.max_seq, COALESCE(m.max_seq, 9223372036854775807)) AS hi
      FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id WHERE m.user_id = :u
)
SELECT x.conv_id, x.seq FROM w JOIN messages x
    ON x.conv_id = w.conv_id AND x.seq BETWEEN w.lo AND w.hi
 WHERE NOT x.recalled AND x.search @@ CAST(:q AS tsquery)
 ORDER BY x.server_time DESC, x.conv_id DESC, x.seq DESC LIMIT 60
"""


async def check_exact(conn: Any, u: int, q: str, label: str) -> None:
    """Three pages of 20 through the production path, against a plain statement that
    sorts every match: the same messages in the same order, or the benchmark stops."""
    tsquery = query(q)
    want = [
        (str(c), int(s)) for c, s in await conn.execute(text(_ALL_MATCHES), {"u": u, "q": tsquery})
    ]
    got: list[tuple[str, int]] = []
    before = None
    for _ in range(3):
        page = await search_store.find(conn, u, parts(q), 21, before=before)
        got += [(m["conv_id"], m["seq"]) for m in page[:20]]
        if len(page) < 21:
            break
        last = page[19]
        before = search_store.Position(last["server_time"], last["conv_id"], last["seq"])
    if got != want:
        raise AssertionError(
            f"{label}: pages differ from the sorted matches: {got[:5]} vs {want[:5]}"
        )


async def explain(conn: Any, u: int, common: str, rare: str) -> dict[str, str]:
    """EXPLAIN ANALYZE of the two ways a conversation is read, over all of U's
    conversations: in time order (first round, the common word) and through the GIN
    index (the rare word)."""
    wins = await search_store.windows(conn, u, None)
    arrays = {
        "c": [w.conv_id for w in wins],
        "lo": [w.lo for w in wins],
        "hi": [w.hi for w in wins],
        "bt": [2**63 - 1] * len(wins),
        "bq": [0] * len(wins),
    }
    out = {}
    for name, sql, params in (
        (
            "time_order_common_word",
            search_store._RECENT,
            {**arrays, "q": common, "budget": search_store.FIRST_BUDGET},
        ),
        (
            "gin_rare_word",
            search_store._SPARSE,
            {**arrays, "q": rare, "driver": rare, "cap": search_store.DENSE_AT},
        ),
    ):
        r = await conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql), params)
        out[name] = "\n".join(row[0] for row in r)
    return out


# --------------------------------------------------------------------------- persister


async def time_persister(
    pg: asyncpg.Connection, args: argparse.Namespace, corpus: Corpus
) -> dict[str, Any]:
    """persist_batch rows/s, rounds with search tokens and without, alternating. Without:
    ``search_document`` answers None (what the statement wrote before search)."""
    rnd = random.Random(3)
    base_gid = 10**12
    seq = 0
    real_doc = msg_store.search_document
    with_rates: list[float] = []
    without_rates: list[float] = []
    with_cpu: list[float] = []
    without_cpu: list[float] = []
    conv_ids = [f"g:{base_gid + i}" for i in range(200)]
    try:
        for rnd_i in range(args.persister_rounds * 2):
            tokens = rnd_i % 2 == 1  # the last round with tokens
            msg_store.search_document = real_doc if tokens else (lambda m: None)
            batches = []
            for _ in range(args.persister_batches):
                batch = []
                seq += 1
                for k in range(args.batch):
                    c = conv_ids[k % len(conv_ids)]
                    s = seq * (args.batch // len(conv_ids) + 1) + k // len(conv_ids)
                    batch.append(
                        NewMessage(
                            c,
                            s,
                            1,
                            f"p{rnd_i}-{seq}-{k}",
                            "text",
                            orjson.dumps({"text": corpus.text(rnd)}).decode(),
                            int(time.time() * 1000),
                        )
                    )
                batches.append(batch)
            n = 0
            cpu0 = time.process_time()
            t = time.perf_counter()
            for batch in batches:
                res = await msg_store.persist_batch(pg, batch, set(), [])
                n += res.inserted
            wall = time.perf_counter() - t
            cpu = time.process_time() - cpu0
            (with_rates if tokens else without_rates).append(n / wall)
            (with_cpu if tokens else without_cpu).append(cpu / n * 1e6)
    finally:
        msg_store.search_document = real_doc
    w, wo = statistics.median(with_rates), statistics.median(without_rates)
    return {
        "batch": args.batch,
        "rounds_each": args.persister_rounds,
        "rows_per_round": args.batch * args.persister_batches,
        "with_search_rows_per_s": round(w),
        "without_search_rows_per_s": round(wo),
        "ratio_with_over_without": round(w / wo, 2),
        "persister_cpu_us_per_row_with": round(statistics.median(with_cpu), 1),
        "persister_cpu_us_per_row_without": round(statistics.median(without_cpu), 1),
        "all_with": [round(x) for x in with_rates],
        "all_without": [round(x) for x in without_rates],
    }


# --------------------------------------------------------------------------- main


async def bench(stores: Stores, args: argparse.Namespace) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)
    corpus = Corpus()
    dsn = stores.pg.url.replace("postgresql+asyncpg", "postgresql")
    pg = await asyncpg.connect(dsn, command_timeout=1800)
    try:
        data = await build(pg, args, corpus)
        qs = queries(corpus, data.pop("sample_cn"))
        # the persister first: its last round leaves the index as a live one is while
        # messages come in (with fastupdate on: a pending list that searches must read)
        persister = await time_persister(pg, args, corpus)
        timing = await time_search(stores, args, data["user_id"], qs)
    finally:
        await pg.close()
    data.pop("mine")
    return {
        "benchmark": "search",
        "machine": {
            "cpus": os.cpu_count(),
            "note": "shared, noisy",
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "params": {k: v for k, v in vars(args).items() if k != "json"},
        "data": data,
        "search": timing,
        "persister": persister,
    }


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    d, s, p = res["data"], res["search"], res["persister"]
    console = Console()
    tab = Table(
        title=f"Search for one user in {d['u_conversations']} conversations "
        f"({d['u_visible_messages']:,} visible), {d['messages']:,} messages, "
        f"{res['machine']['cpus']} CPUs (shared, load {res['machine']['loadavg_1m_start']})"
    )
    for col in ("script", "query", "matches", "p50", "p99", "no index p50", "ratio"):
        tab.add_column(col, justify="left" if col in ("script", "query") else "right")
    for r in s["queries"]:
        b = r["baseline_p50_ms"]
        tab.add_row(
            r["script"],
            r["query"],
            f"{r['matches']:,}",
            f"{r['p50_ms']} ms",
            f"{r['p99_ms']} ms",
            f"{b} ms" if b is not None else "-",
            f"{b / r['p50_ms']:.0f}x" if b is not None and r["p50_ms"] else "-",
        )
    console.print(tab)
    console.print(
        f"all Latin queries: p50 {s['latin']['p50_ms']} ms, p99 {s['latin']['p99_ms']} ms "
        f"({s['latin']['runs']} runs); all CJK: p50 {s['cjk']['p50_ms']} ms, p99 "
        f"{s['cjk']['p99_ms']} ms ({s['cjk']['runs']} runs)"
        + (
            f"; second pages p50 {s['second_page']['p50_ms']} / p99 {s['second_page']['p99_ms']} ms"
            if s["second_page"]
            else ""
        )
    )
    console.print(
        f"GIN index: {d['index_mb']} MB ({d['index_mb_per_million']} MB per million messages); "
        f"time-order index {d['time_index_mb_per_million']} MB per million; "
        f"search column {d['column_mb_per_million']} MB per million; messages with all indexes "
        f"{d['messages_total_mb']} MB; index build {d['index_build_s']} s"
    )
    console.print(
        f"persister (batches of {p['batch']}): {p['with_search_rows_per_s']:,} rows/s with search, "
        f"{p['without_search_rows_per_s']:,} without ({p['ratio_with_over_without']}x); its "
        f"process CPU {p['persister_cpu_us_per_row_with']} vs {p['persister_cpu_us_per_row_without']} µs per row"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench search", description=__doc__.split("\n\n")[0]
    )
    add_layout_args(ap)
    ap.add_argument("--runs", type=int, default=40, help="timed runs of each query")
    ap.add_argument(
        "--baseline-rounds", type=int, default=2, help="runs of each query without the index"
    )
    ap.add_argument("--batch", type=int, default=1000, help="persister batch size")
    ap.add_argument("--persister-batches", type=int, default=10, help="batches per persister round")
    ap.add_argument("--persister-rounds", type=int, default=4, help="persister rounds each way")
    ap.add_argument(
        "--fastupdate",
        default="off",
        help="the index's fastupdate: off (as migration 0015 builds it) or a pending list size in kB",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    check_layout_args(ap, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = run_with_stores("im-search-bench-", lambda stores: bench(stores, args))
    report(res, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
