"""``messages`` hash-partitioned by ``conv_id`` and the ``message_dedupe`` table.

The migration converts a populated 0011 database in place (every row, seq and index
kept, the dedupe keys moved to their own table) and back; the persister claims each
message's dedupe key in the statement that stores it (a replayed batch changes nothing,
a repeated key is not stored, whatever its conversation); and the main reads of one
conversation (history, unread, sync catch-up) run on one partition, while a dedupe
lookup reads no partition at all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from im_server.runtime.embedded import start_postgres
from im_server.runtime.postgres import EmbeddedPostgres
from im_server.storage import conv_states
from im_server.storage import messages as msg_store
from im_server.storage import sync as sync_store
from im_server.storage.db import ROOT
from im_server.storage.messages import NewMessage

PARTITIONS = [f"messages_p{i:02d}" for i in range(16)]


def alembic_cfg(pgs: EmbeddedPostgres) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", pgs.url.replace("%", "%%"))
    return cfg


async def migrate(pgs: EmbeddedPostgres, to: str, down: bool = False) -> None:
    fn = command.downgrade if down else command.upgrade
    await asyncio.to_thread(fn, alembic_cfg(pgs), to)  # Alembic runs its own loop


def dsn(pgs: EmbeddedPostgres) -> str:
    return pgs.url.replace("postgresql+asyncpg://", "postgresql://")


@contextlib.asynccontextmanager
async def sa_engine(pgs: EmbeddedPostgres) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(pgs.url)
    try:
        yield engine
    finally:
        await engine.dispose()


def msg(conv: str, seq: int, sender: int, cmid: str, text: str = "hi") -> NewMessage:
    return NewMessage(conv, seq, sender, cmid, "text", orjson.dumps({"text": text}).decode(), 1000)


async def persist(db: asyncpg.Connection, batch: list[NewMessage]) -> int:
    return (await msg_store.persist_batch(db, batch, set(), [])).inserted


# --------------------------------------------------------------------------- the migration

# A 0011 database with history in 120 conversations: singles and groups, mentions,
# replies, recalled and edited messages, senders reusing no key, plus the tables that
# point at messages by (conv_id, seq).
_FILL_0011 = [
    """
    INSERT INTO conversations (conv_id, conv_type, max_seq, seq_reserved, version, created_at)
    SELECT CASE WHEN c % 3 = 0 THEN 'g:' || c ELSE 's:' || c || ':' || (c + 1000) END,
           CASE WHEN c % 3 = 0 THEN 2 ELSE 1 END, 5 + c % 17, 5 + c % 17, c, 1
      FROM generate_series(1, 120) c
    """,
    """
    INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, content, server_time,
                          recalled, mentions, mention_all, reply_to, edited_at, edit_seq)
    SELECT cv.conv_id, s, 1 + (s * 7 + length(cv.conv_id)) % 5, cv.conv_id || '/' || s,
           CASE WHEN s % 11 = 0 THEN 'system' ELSE 'text' END,
           CASE WHEN s % 13 = 0 THEN NULL ELSE jsonb_build_object('text', 'm' || s) END,
           1700000000000 + s, s % 13 = 0,
           CASE WHEN s % 4 = 1 THEN ARRAY[2, 3]::bigint[] ELSE '{}'::bigint[] END,
           s % 9 = 0, CASE WHEN s > 2 THEN s - 2 END,
           CASE WHEN s % 6 = 0 THEN 1700000000500 + s END, CASE WHEN s % 6 = 0 THEN s + 100 END
      FROM conversations cv CROSS JOIN generate_series(1, cv.max_seq) s
    """,
    """
    INSERT INTO conv_members (conv_id, user_id, read_seq, joined_at)
    SELECT conv_id, u, CASE WHEN u = 1 THEN 2 END, 1 FROM conversations, generate_series(1, 3) u
    """,
    """
    INSERT INTO reactions (conv_id, seq, user_id, emoji, created_at)
    SELECT conv_id, 1, u, '👍', 5 FROM conversations, generate_series(1, 2) u
    """,
    "INSERT INTO reaction_counts (conv_id, seq, emoji, count) SELECT conv_id, 1, '👍', 2 FROM conversations",
    """
    INSERT INTO message_uploads (upload_id, conv_id, seq)
    SELECT 'up-' || conv_id, conv_id, 2 FROM conversations
    """,
    "INSERT INTO push_outbox (conv_id, seq, created_at) SELECT conv_id, 3, 7 FROM conversations",
]

_SNAPSHOT = {
    "messages": "SELECT * FROM messages ORDER BY conv_id, seq",
    "reactions": "SELECT * FROM reactions ORDER BY conv_id, seq, user_id",
    "reaction_counts": "SELECT * FROM reaction_counts ORDER BY conv_id, seq",
    "message_uploads": "SELECT * FROM message_uploads ORDER BY upload_id",
    "push_outbox": "SELECT * FROM push_outbox ORDER BY conv_id, seq",
    "conversations": "SELECT * FROM conversations ORDER BY conv_id",
    "conv_members": "SELECT * FROM conv_members ORDER BY conv_id, user_id",
}


async def snapshot(db: asyncpg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {name: [tuple(r) for r in await db.fetch(sql)] for name, sql in _SNAPSHOT.items()}


async def index_defs(db: asyncpg.Connection, table: str) -> dict[str, str]:
    rows = await db.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1 ORDER BY 1", table
    )
    return {r["indexname"]: r["indexdef"] for r in rows}


async def test_migration_partitions_messages_in_place(tmp_path: Path) -> None:
    pgs = start_postgres(tmp_path / "pg", fsync=False)
    try:
        await migrate(pgs, "0011")
        db = await asyncpg.connect(dsn(pgs))
        try:
            for sql in _FILL_0011:
                await db.execute(sql)
            before = await snapshot(db)
            n = len(before["messages"])
            assert n > 1000 and before["messages"][0][0] == "g:102", n
            keys = await db.fetch(
                "SELECT sender_id, client_msg_id, conv_id, seq, server_time FROM messages"
            )
        finally:
            await db.close()

        await migrate(pgs, "0012")  # the partitioning itself; later ones add columns
        db = await asyncpg.connect(dsn(pgs))
        try:
            # the same rows, every column, every seq; the neighbouring tables untouched
            assert await snapshot(db) == before
            assert (
                await db.fetchval(
                    "SELECT c.relkind::text || ' ' || pg_get_partkeydef(c.oid) FROM pg_class c "
                    "WHERE c.relname = 'messages'"
                )
                == "p HASH (conv_id)"
            )
            parts = await db.fetch(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound "
                "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'messages'::regclass ORDER BY 1"
            )
            assert [r["relname"] for r in parts] == PARTITIONS
            assert all(
                r["bound"] == f"FOR VALUES WITH (modulus 16, remainder {i})"
                for i, r in enumerate(parts)
            ), parts
            spread = await db.fetchval("SELECT count(DISTINCT tableoid) FROM messages")
            assert spread == 16, spread

            parent = await index_defs(db, "messages")
            assert parent == {
                "messages_pkey": "CREATE UNIQUE INDEX messages_pkey ON ONLY public.messages "
                "USING btree (conv_id, seq) INCLUDE (sender_id, content_type)",
                "messages_sender": "CREATE INDEX messages_sender ON ONLY public.messages "
                "USING btree (conv_id, sender_id, seq)",
                "messages_mentions": "CREATE INDEX messages_mentions ON ONLY public.messages "
                "USING btree (conv_id, seq) INCLUDE (sender_id, content_type, mention_all, "
                "mentions) WHERE (mention_all OR (cardinality(mentions) > 0))",
            }, parent
            for p in PARTITIONS:
                own = await index_defs(db, p)
                assert sorted(own) == [f"{p}_mentions", f"{p}_pkey", f"{p}_sender"], own
                assert own[f"{p}_mentions"].endswith(
                    "WHERE (mention_all OR (cardinality(mentions) > 0))"
                )
            # every partition index is attached (so the parent's are valid and unique)
            assert not await db.fetch(
                "SELECT indexrelid::regclass FROM pg_index "
                "WHERE indrelid = 'messages'::regclass AND NOT indisvalid"
            )
            assert not await db.fetch(
                "SELECT 1 FROM pg_constraint WHERE confrelid = 'messages'::regclass"
            )

            dedupe = await db.fetch(
                "SELECT sender_id, client_msg_id, conv_id, seq, server_time FROM message_dedupe"
            )
            assert sorted(map(tuple, dedupe)) == sorted(map(tuple, keys))
            assert await index_defs(db, "message_dedupe") == {
                "message_dedupe_pkey": "CREATE UNIQUE INDEX message_dedupe_pkey ON "
                "public.message_dedupe USING btree (sender_id, client_msg_id)"
            }

            # dedupe works on the migrated keys: looked up, and a repeat is not stored,
            # by today's persister (so on today's schema: later migrations add columns)
            await migrate(pgs, "head")
            sample = [(int(k[0]), str(k[1])) for k in keys[::97]]
            async with sa_engine(pgs) as engine, engine.connect() as conn:
                found = await msg_store.by_dedupe_keys(conn, [*sample, (1, "never-sent")])
                assert await msg_store.any_messages(conn)
            want = {(int(k[0]), str(k[1])): (k[2], k[3], k[4]) for k in keys[::97]}
            assert found == want
            old = keys[5]
            conv, top = str(old["conv_id"]), int(before["messages"][-1][1])
            repeat = msg(conv, 500, int(old["sender_id"]), str(old["client_msg_id"]))
            assert await persist(db, [repeat]) == 0
            async with sa_engine(pgs) as engine, engine.connect() as conn:
                assert await msg_store.absent(conn, [(conv, 500)]) == [(conv, 500)]
            fresh = msg(conv, 500, int(old["sender_id"]), "after-the-migration")
            assert await persist(db, [fresh]) == 1
            assert (
                await db.fetchval(
                    "SELECT seq FROM message_dedupe WHERE sender_id = $1 AND client_msg_id = $2",
                    fresh.sender_id,
                    fresh.client_msg_id,
                )
                == 500
                and top < 500
            )
        finally:
            await db.close()

        # and back: the plain table with its unique dedupe index, the rows as they were
        # (plus the one stored above)
        await migrate(pgs, "0011", down=True)
        db = await asyncpg.connect(dsn(pgs))
        try:
            after = await snapshot(db)
            stored = [r for r in after["messages"] if r[3] == "after-the-migration"]
            assert len(stored) == 1
            assert [r for r in after["messages"] if r[3] != "after-the-migration"] == before[
                "messages"
            ]
            assert (
                await db.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'messages'")
                == "r"
            )
            assert await db.fetchval("SELECT to_regclass('message_dedupe')") is None
            assert "messages_dedupe" in await index_defs(db, "messages")
        finally:
            await db.close()
        await migrate(pgs, "head")  # and up again
    finally:
        pgs.stop()


# --------------------------------------------------------------------------- on head


@pytest.fixture(scope="module")
def head_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    pgs = start_postgres(tmp_path_factory.mktemp("partpg") / "pg", fsync=False)
    try:
        command.upgrade(alembic_cfg(pgs), "head")
        yield pgs
    finally:
        pgs.stop()


@pytest.fixture
async def db(head_pg: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn(head_pg))
    try:
        yield conn
    finally:
        await conn.close()


async def stored(db: asyncpg.Connection, conv: str) -> list[tuple[int, int, str, str]]:
    rows = await db.fetch(
        "SELECT seq, sender_id, client_msg_id, content->>'text' AS t FROM messages "
        "WHERE conv_id = $1 ORDER BY seq",
        conv,
    )
    return [(r["seq"], r["sender_id"], r["client_msg_id"], r["t"]) for r in rows]


async def dedupe_rows(db: asyncpg.Connection, sender: int) -> list[tuple[str, str, int, int]]:
    rows = await db.fetch(
        "SELECT client_msg_id, conv_id, seq, server_time FROM message_dedupe "
        "WHERE sender_id = $1 ORDER BY client_msg_id",
        sender,
    )
    return [tuple(r) for r in rows]


async def test_persister_writes_the_dedupe_row_and_a_replay_changes_nothing(
    db: asyncpg.Connection,
) -> None:
    batch = [msg("s:71:72", q, 71 + q % 2, f"r-{q}", f"t{q}") for q in range(1, 6)]
    assert await persist(db, batch) == 5
    rows = await stored(db, "s:71:72")
    assert rows == [(q, 71 + q % 2, f"r-{q}", f"t{q}") for q in range(1, 6)]
    assert await dedupe_rows(db, 72) == [
        (f"r-{q}", "s:71:72", q, 1000) for q in range(1, 6) if q % 2 == 1
    ]
    version = await db.fetchval("SELECT version FROM conversations WHERE conv_id = 's:71:72'")

    # the same batch again, and again with other content: nothing changes but the version
    assert await persist(db, batch) == 0
    changed = [msg(m.conv_id, m.seq, m.sender_id, m.client_msg_id, "other") for m in batch]
    assert await persist(db, changed) == 0
    assert await stored(db, "s:71:72") == rows
    assert len(await dedupe_rows(db, 71)) == 2 and len(await dedupe_rows(db, 72)) == 3
    assert (
        await db.fetchval("SELECT version FROM conversations WHERE conv_id = 's:71:72'") > version
    )


async def test_a_repeated_key_is_stored_once_whatever_its_conversation(
    db: asyncpg.Connection, head_pg: EmbeddedPostgres
) -> None:
    """(sender, client_msg_id) is unique across conversations: in one batch the first in
    batch order is stored; a later batch repeating a stored key (in its conversation or
    another) stores nothing for it, and the persister's check sees its seq absent."""
    batch = [
        msg("g:81", 1, 81, "k-1", "first"),
        msg("g:82", 1, 81, "k-1", "same key, other conversation"),
        msg("g:81", 2, 81, "k-1", "same key, same conversation"),
        msg("g:82", 2, 81, "k-2", "fresh"),
    ]
    assert await persist(db, batch) == 2
    assert await stored(db, "g:81") == [(1, 81, "k-1", "first")]
    assert await stored(db, "g:82") == [(2, 81, "k-2", "fresh")]
    assert await dedupe_rows(db, 81) == [("k-1", "g:81", 1, 1000), ("k-2", "g:82", 2, 1000)]

    later = [msg("g:83", 1, 81, "k-2", "again"), msg("g:83", 2, 82, "k-2", "other sender")]
    assert await persist(db, later) == 1
    assert await stored(db, "g:83") == [(2, 82, "k-2", "other sender")]
    async with sa_engine(head_pg) as engine, engine.connect() as conn:
        gone = await msg_store.absent(conn, [(m.conv_id, m.seq) for m in [*batch, *later]])
        found = await msg_store.by_dedupe_keys(conn, [(81, "k-1"), (82, "k-2"), (83, "k-1")])
    assert sorted(gone) == [("g:81", 2), ("g:82", 1), ("g:83", 1)]
    assert found == {(81, "k-1"): ("g:81", 1, 1000), (82, "k-2"): ("g:83", 2, 1000)}

    # a (conv_id, seq) already stored under another key (a seq handed out twice) keeps
    # its message; the key the statement claimed for it is given back by the check the
    # persister runs after a batch that stored fewer rows than it holds, and only it
    usurper = msg("g:81", 1, 81, "k-3", "usurper")
    assert await persist(db, [usurper]) == 0
    assert await stored(db, "g:81") == [(1, 81, "k-1", "first")]
    async with sa_engine(head_pg) as engine, engine.begin() as conn:
        taken = await msg_store.release_taken_keys(conn, [*batch, *later, usurper])
    assert taken == [("g:81", 1)]
    assert await dedupe_rows(db, 81) == [("k-1", "g:81", 1, 1000), ("k-2", "g:82", 2, 1000)]


# --------------------------------------------------------------------------- pruning


class Captured:
    """The statements a storage call sent, with their parameters, to EXPLAIN them."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.sent: list[tuple[str, Any]] = []
        event.listen(engine.sync_engine, "before_cursor_execute", self._hook)

    def _hook(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        self.sent.append((statement, params))


def scanned(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every scan the execution ran at least once (a
    bitmap index scan names its index only)."""
    out: list[tuple[str, str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        if ("Relation Name" in node or "Index Name" in node) and node.get("Actual Loops", 0) > 0:
            out.append(
                (node["Node Type"], node.get("Relation Name", ""), node.get("Index Name", ""))
            )
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return out


async def explained(conn: AsyncConnection, cap: Captured) -> list[tuple[str, str, str]]:
    assert len(cap.sent) == 1, cap.sent
    statement, params = cap.sent.pop()
    r = await conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
    cap.sent.clear()  # the EXPLAIN itself
    doc = r.scalar_one()
    plan = orjson.loads(doc)[0] if isinstance(doc, str) else doc[0]
    return scanned(plan)


def on_messages(scans: list[tuple[str, str, str]]) -> set[str]:
    return {rel for _t, rel, _i in scans if rel == "messages" or rel.startswith("messages_p")}


async def test_a_conversations_reads_scan_one_partition(
    db: asyncpg.Connection, head_pg: EmbeddedPostgres
) -> None:
    """History by seq range, the unread statement, the sync catch-up and the dedupe
    lookup, run on 64 conversations spread over every partition: each read of one
    conversation executes scans on its own partition only (pruned at plan time or when
    the conversation's key is known), through the same indexes as before, index-only
    where they were (sequential scans off, as the tables are small); a dedupe lookup
    reads message_dedupe alone."""
    u = 91
    convs = [f"g:9{i:03d}" for i in range(64)]
    batch = [
        NewMessage(
            c,
            q,
            u if q % 4 == 0 else 92,
            f"{c}/{q}",
            "text",
            '{"text": "x"}',
            1000 + q,
            mentions=[u] if q % 5 == 0 else [],
        )
        for c in convs
        for q in range(1, 31)
    ]
    assert await persist(db, batch) == len(batch)
    await db.execute(
        "INSERT INTO conv_members (conv_id, user_id, read_seq, joined_at) "
        "SELECT c, u, CASE WHEN u = $2 THEN 10 END, 1 FROM unnest($1::text[]) c, unnest(ARRAY[$2, 92]) u",
        convs,
        u,
    )
    await db.execute("VACUUM ANALYZE messages")  # the visibility map: index-only means no heap
    assert await db.fetchval("SELECT count(DISTINCT tableoid) FROM messages") == 16
    conv = convs[0]
    home = await db.fetchval(
        "SELECT tableoid::regclass::text FROM messages WHERE conv_id = $1 LIMIT 1", conv
    )
    # the unread statement runs per conversation of the user: one conversation here
    await db.execute("DELETE FROM conv_members WHERE user_id = $1 AND conv_id <> $2", u, conv)

    async with sa_engine(head_pg) as engine, engine.connect() as conn:
        # a few rows per partition: without this the planner rightly reads them whole
        await conn.exec_driver_sql("SET enable_seqscan = off")
        cap = Captured(engine)

        history = await msg_store.message_range(conn, conv, 5, 20, descending=True)
        assert [m["seq"] for m in history] == list(range(20, 4, -1))
        scans = await explained(conn, cap)
        assert on_messages(scans) == {home}, scans
        assert {i for _t, _r, i in scans} - {""} == {f"{home}_pkey"}, scans

        counts = await conv_states.unread_counts(conn, u)
        assert counts == [(conv, 15, 3)], counts
        scans = await explained(conn, cap)
        assert on_messages(scans) == {home}, scans
        idx = {(t, i) for t, r, i in scans if r == home}
        # the block edge on the primary key, my own messages on messages_sender (which
        # includes content_type), the mentions on their partial index: no heap
        assert idx == {
            ("Index Only Scan", f"{home}_pkey"),
            ("Index Only Scan", f"{home}_sender"),
            ("Index Only Scan", f"{home}_mentions"),
        }, scans

        recent = await sync_store.recent_messages(conn, [(conv, 1, 30)], 10)
        assert [m["seq"] for m in recent[conv]] == list(range(21, 31))
        scans = await explained(conn, cap)
        assert on_messages(scans) == {home}, scans

        found = await msg_store.by_dedupe_keys(conn, [(92, f"{conv}/1"), (u, f"{conv}/4")])
        assert found == {(92, f"{conv}/1"): (conv, 1, 1001), (u, f"{conv}/4"): (conv, 4, 1004)}
        scans = await explained(conn, cap)
        assert on_messages(scans) == set(), scans
        assert {r for _t, r, _i in scans} - {""} == {"message_dedupe"}, scans


async def test_webhook_rows_come_with_the_batch_once(db: asyncpg.Connection) -> None:
    """With webhooks registered, the batch's statement writes one outbox row per event
    and webhook taking its type, in its own commit; a replayed batch writes none."""
    everything = await db.fetchval(
        "INSERT INTO webhooks (url, events, secret, created_at) "
        "VALUES ('http://a/', '{*}', 's', 1) RETURNING webhook_id"
    )
    users_only = await db.fetchval(
        "INSERT INTO webhooks (url, events, secret, created_at) "
        "VALUES ('http://b/', '{user.created}', 's', 1) RETURNING webhook_id"
    )
    try:
        batch = [msg("s:81:82", q, 81, f"w-{q}", f"t{q}") for q in range(1, 4)]
        batch.append(
            NewMessage("s:81:82", 4, 81, "w-4", "recall", orjson.dumps({"seq": 3}).decode(), 1000)
        )
        done = await msg_store.persist_batch(db, batch, set(), [])
        assert done.hooked == 4
        for _ in range(2):  # replays, the persister's after a crash
            assert (await msg_store.persist_batch(db, batch, set(), [])).hooked == 0
        rows = await db.fetch(
            "SELECT webhook_id, event_key, conv_key, type, data->>'seq' AS seq "
            "FROM webhook_outbox WHERE conv_key = 's:81:82' ORDER BY delivery_id"
        )
        assert [(r["webhook_id"], r["event_key"], r["type"], r["seq"]) for r in rows] == [
            (everything, "msg_s:81:82_1", "message.created", "1"),
            (everything, "msg_s:81:82_2", "message.created", "2"),
            (everything, "msg_s:81:82_3", "message.created", "3"),
            (everything, "msg_s:81:82_4", "message.recalled", "4"),
        ]
        assert users_only not in {r["webhook_id"] for r in rows}
    finally:
        await db.execute(
            "DELETE FROM webhooks WHERE webhook_id = ANY($1)", [everything, users_only]
        )
