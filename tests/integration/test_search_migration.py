"""Migration 0015 on a populated 0014 database: the messages stored before it get their
search tokens (in batches: more rows than one batch), notices, recalled and contentless
messages none; the index on every partition; a search finds the old messages; and
back down to 0014 and up again."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import orjson

from im_server.runtime.embedded import start_postgres
from im_server.search_text import message_document, query
from im_server.storage import search as search_store
from im_server.storage.search import Position
from tests.integration.test_messages_partitioned import PARTITIONS, dsn, migrate, sa_engine

CONVS = ["s:1:2", "g:7", "s:2:3"]
ROWS_PER_CONV = 1100  # 3300 rows: more than one backfill batch (2000)

_FILL_0014 = [
    """
    INSERT INTO conversations (conv_id, conv_type, max_seq, seq_reserved, version, created_at)
    SELECT c, CASE WHEN left(c, 2) = 'g:' THEN 2 ELSE 1 END, $1, $1, 1, 1
      FROM unnest($2::text[]) c
    """,
    """
    INSERT INTO conv_members (conv_id, user_id, read_seq, joined_at)
    VALUES ('s:1:2', 1, 0, 1), ('s:1:2', 2, 0, 1), ('g:7', 1, 0, 1), ('g:7', 3, 0, 1),
           ('s:2:3', 2, 0, 1), ('s:2:3', 3, 0, 1)
    """,
    """
    INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, content,
                          server_time, recalled, mentions, mention_all, reply_to)
    SELECT c, s, 1, c || '/' || s, 'text', jsonb_build_object('text', 'filler ' || s),
           1700000000000 + s, false, '{}'::bigint[], false, NULL
      FROM unnest($2::text[]) c CROSS JOIN generate_series(1, $1 - 11) s
    """,
]

# (conv, seq offset from the end, content_type, content, recalled)
SPECIAL: list[tuple[str, int, str, object, bool]] = [
    ("s:1:2", 10, "text", {"text": "Old message about the Café tomorrow"}, False),
    ("s:1:2", 9, "text", {"text": "你好世界，老消息"}, False),
    ("s:1:2", 8, "file", {"upload_id": "u1", "name": "budget-Résumé.pdf", "size": 3}, False),
    ("s:1:2", 7, "system", {"event": "members_added", "text": "tomorrow notice"}, False),
    ("s:1:2", 6, "edit", {"seq": 1, "content": {"text": "tomorrow edited"}}, False),
    ("s:1:2", 5, "text", None, True),  # recalled: content blanked
    ("s:1:2", 4, "text", {"text": "?!"}, False),  # nothing searchable
    ("s:1:2", 3, "image", {"upload_id": "u2", "width": 3, "height": 4}, False),
    ("g:7", 10, "text", {"text": "tomorrow in the group"}, False),
    ("g:7", 9, "reaction", {"seq": 1, "emoji": "x", "user_id": 1, "op": "add"}, False),
    ("s:2:3", 10, "text", {"text": "tomorrow elsewhere"}, False),
]


async def test_0015_backfills_search_tokens(tmp_path: Path) -> None:
    pgs = start_postgres(tmp_path / "pg", fsync=False)
    try:
        await migrate(pgs, "0014")
        db = await asyncpg.connect(dsn(pgs))
        try:
            for sql in _FILL_0014:
                args = (ROWS_PER_CONV, CONVS) if "$2" in sql else ()
                await db.execute(sql, *args)
            for conv, back, ctype, content, recalled in SPECIAL:
                await db.execute(
                    "INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, "
                    "content, server_time, recalled, mentions, mention_all) "
                    "VALUES ($1, $2, 1, $3, $4, $5::jsonb, $6, $7, '{}', false)",
                    conv,
                    ROWS_PER_CONV - back,
                    f"{conv}/special/{back}",
                    ctype,
                    None if content is None else orjson.dumps(content).decode(),
                    1700000000000 + ROWS_PER_CONV - back,
                    recalled,
                )
            assert await db.fetchval("SELECT count(*) FROM messages") == 3 * (
                ROWS_PER_CONV - 11
            ) + len(SPECIAL)
        finally:
            await db.close()

        await migrate(pgs, "0015")
        db = await asyncpg.connect(dsn(pgs))
        try:
            rows = await db.fetch(
                "SELECT conv_id, seq, content_type, content::text AS c, recalled, "
                "search::text AS s FROM messages"
            )
            notices = {"system", "recall", "edit", "reaction"}
            for r in rows:
                if r["content_type"] in notices or r["recalled"] or r["c"] is None:
                    assert r["s"] is None, dict(r)
                    continue
                want = message_document(r["c"])
                if want is None:
                    assert r["s"] is None, dict(r)
                else:
                    # the backfill wrote what the persister would write
                    canon = await db.fetchval("SELECT CAST($1::text AS tsvector)::text", want)
                    assert r["s"] == canon, dict(r)
            indexed = await db.fetchval("SELECT count(*) FROM messages WHERE search IS NOT NULL")
            # every filler, and the five special messages with words
            assert indexed == 3 * (ROWS_PER_CONV - 11) + 5
            for p in PARTITIONS:
                assert await db.fetchval(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = $1", f"{p}_search"
                ) == (
                    f"CREATE INDEX {p}_search ON public.{p} USING gin (conv_id, search) "
                    "WITH (fastupdate=off) WHERE (search IS NOT NULL)"
                )
            assert not await db.fetch(
                "SELECT indexrelid::regclass FROM pg_index "
                "WHERE indrelid = 'messages'::regclass AND NOT indisvalid"
            )
        finally:
            await db.close()

        # the old messages are found, in the user's windows
        async with sa_engine(pgs) as engine, engine.connect() as conn:

            async def seqs(user: int, q: str) -> list[tuple[str, int]]:
                tsq = query(q)
                assert tsq is not None
                found = await search_store.search(conn, user, tsq, 50)
                return [(m["conv_id"], m["seq"]) for m in found]

            top = ROWS_PER_CONV
            # the same server_time: conv_id descending
            assert await seqs(1, "tomorrow") == [("s:1:2", top - 10), ("g:7", top - 10)]
            assert await seqs(2, "tomorrow") == [("s:2:3", top - 10), ("s:1:2", top - 10)]
            assert await seqs(3, "tomor") == [("s:2:3", top - 10), ("g:7", top - 10)]
            assert await seqs(1, "cafe") == [("s:1:2", top - 10)]
            assert await seqs(2, "世界") == [("s:1:2", top - 9)]
            assert await seqs(2, "resume budget") == [("s:1:2", top - 8)]
            assert await seqs(1, "edited") == []
            assert await seqs(1, "notice") == []
            assert await seqs(3, "filler 1089") == [
                ("s:2:3", 1089),
                ("g:7", 1089),
            ]
            assert len(await seqs(1, "filler")) == 50

            # paging where two conversations share every server_time: (time, conv, seq)
            tsq = query("filler 10")
            assert tsq is not None
            pages: list[list[tuple[str, int]]] = []
            before: Position | None = None
            while True:
                found = await search_store.search(conn, 3, tsq, 7, before=before)
                pages.append([(m["conv_id"], m["seq"]) for m in found])
                if len(found) < 7:
                    break
                last = found[-1]
                before = Position(last["server_time"], last["conv_id"], last["seq"])
            flat = [k for p in pages for k in p]
            tens = [s for s in range(1, ROWS_PER_CONV - 10) if str(s).startswith("10")]
            expected = [(c, s) for s in sorted(tens, reverse=True) for c in ("s:2:3", "g:7")]
            assert flat == expected

        # down: the column and the index go; up again: back
        await migrate(pgs, "0014", down=True)
        db = await asyncpg.connect(dsn(pgs))
        try:
            assert not await db.fetchval(
                "SELECT count(*) FROM information_schema.columns "
                "WHERE table_name = 'messages' AND column_name = 'search'"
            )
            assert not await db.fetch("SELECT 1 FROM pg_indexes WHERE indexname LIKE '%search%'")
        finally:
            await db.close()
        await migrate(pgs, "head")
        db = await asyncpg.connect(dsn(pgs))
        try:
            assert (
                await db.fetchval("SELECT count(*) FROM messages WHERE search IS NOT NULL")
                == 3 * (ROWS_PER_CONV - 11) + 5
            )
        finally:
            await db.close()
    finally:
        pgs.stop()
