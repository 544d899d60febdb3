"""Unread counts from ``message_blocks`` (migration 0021): the same numbers as counting
every message, however the rows arrive.

Random conversations are stored through the persister's own statement in shuffled
batches (late and out-of-order rows, replays, seq gaps, notices, mentions across block
edges); random member rows (read cursor or none, window start, window end, mute). Each
user's counts, states and badge must equal a count over the messages in Python, and the
blocks must equal a recount from ``messages``, also after rows are deleted. The migration
fills the blocks of a populated 0020 database, and goes down and up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import orjson
import pytest

from im_server.runtime.embedded import start_postgres
from im_server.runtime.postgres import EmbeddedPostgres
from im_server.storage import conv_states
from im_server.storage import messages as msg_store
from im_server.storage.messages import NewMessage
from tests.integration.test_messages_partitioned import alembic_cfg, dsn, migrate, sa_engine

TYPES = ["text"] * 6 + ["image", "system", "edit", "reaction", "recall"]
USERS = [1, 2, 3, 4]
INF = 1 << 62


@dataclass
class Member:
    conv_id: str
    user_id: int
    read_seq: int | None
    min_seq: int
    max_seq: int | None
    muted: bool


def expected(
    msgs: list[NewMessage], members: list[Member], conv_min: dict[str, int], user: int
) -> tuple[list[tuple[str, int, int]], int]:
    """(conv_id, unread, mention_unread) with unread > 0, and the badge, counted message
    by message with the contract's rules."""
    rows = []
    badge = 0
    for m in sorted((m for m in members if m.user_id == user), key=lambda m: m.conv_id):
        here = [x for x in msgs if x.conv_id == m.conv_id]
        mine = [x.seq for x in here if x.sender_id == user]
        cursor = m.read_seq if m.read_seq is not None else max(mine, default=0)
        lo = max(cursor, max(conv_min[m.conv_id], m.min_seq) - 1)
        hi = m.max_seq if m.max_seq is not None else INF
        counted = [
            x
            for x in here
            if lo < x.seq <= hi
            and x.sender_id != user
            and x.content_type not in conv_states.NOT_COUNTED
        ]
        unread = len(counted)
        mentioned = sum(1 for x in counted if x.mention_all or user in x.mentions)
        if unread:
            rows.append((m.conv_id, unread, mentioned))
            badge += mentioned if m.muted else unread
    return rows, badge


def random_history(rnd: random.Random, conv: str) -> list[NewMessage]:
    out = []
    seq = 0
    for i in range(rnd.randint(1, 330)):
        seq += 1 if rnd.random() < 0.9 else rnd.randint(2, 70)  # gaps, some a block long
        sender = rnd.choice(USERS)
        ctype = rnd.choice(TYPES)
        mentions = rnd.sample(USERS, rnd.randint(1, 2)) if rnd.random() < 0.15 else []
        out.append(
            NewMessage(
                conv,
                seq,
                sender,
                f"{conv}/{i}",
                ctype,
                orjson.dumps({"text": f"m{i}"}).decode(),
                1000 + seq,
                mentions=mentions,
                mention_all=rnd.random() < 0.03,
            )
        )
    return out


def random_member(rnd: random.Random, conv: str, user: int, last: int) -> Member:
    pick = rnd.random()
    return Member(
        conv,
        user,
        None if pick < 0.3 else rnd.choice([0, last, rnd.randint(0, last + 5)]),
        1 if rnd.random() < 0.6 else rnd.randint(1, last + 2),
        None if rnd.random() < 0.7 else rnd.randint(0, last + 3),
        rnd.random() < 0.3,
    )


async def store(db: asyncpg.Connection, rnd: random.Random, msgs: list[NewMessage]) -> None:
    """``msgs`` through the persister's statement: shuffled, in batches of random sizes,
    each batch replayed now and then."""
    order = msgs[:]
    rnd.shuffle(order)
    i = 0
    while i < len(order):
        n = rnd.randint(1, 60)
        batch = order[i : i + n]
        await msg_store.persist_batch(db, batch, set(), [])
        if rnd.random() < 0.2:
            assert (await msg_store.persist_batch(db, batch, set(), [])).inserted == 0
        i += n


async def recount(db: asyncpg.Connection, convs: list[str]) -> tuple[list[tuple[object, ...]], ...]:
    """The blocks as stored, and as counted again from the messages (blocks that hold no
    countable message may be stored as zeros)."""
    stored = await db.fetch(
        "SELECT conv_id, blk, countable, mentioning FROM message_blocks "
        "WHERE conv_id = ANY($1) AND (countable, mentioning) <> (0, 0) ORDER BY 1, 2",
        convs,
    )
    counted = await db.fetch(
        f"SELECT conv_id, seq / {conv_states.BLOCK} AS blk, count(*), "
        "count(*) FILTER (WHERE mention_all OR cardinality(mentions) > 0) FROM messages "
        f"WHERE conv_id = ANY($1) AND content_type NOT IN {conv_states.NOT_COUNTED!r} "
        "GROUP BY 1, 2 ORDER BY 1, 2",
        convs,
    )
    return [tuple(r) for r in stored], [tuple(r) for r in counted]


async def setup_members(
    db: asyncpg.Connection, members: list[Member], conv_min: dict[str, int], last: dict[str, int]
) -> None:
    await db.executemany(
        "INSERT INTO conversations (conv_id, conv_type, group_id, min_seq, max_seq, "
        "seq_reserved, version, created_at) VALUES ($1, 2, $4, $2, $3, $3, 1, 1) "
        "ON CONFLICT (conv_id) DO UPDATE SET conv_type = 2, group_id = EXCLUDED.group_id, "
        "min_seq = EXCLUDED.min_seq",
        [(c, conv_min[c], last[c], zlib.crc32(c.encode())) for c in conv_min],
    )
    await db.executemany(
        "INSERT INTO conv_members (conv_id, user_id, read_seq, min_seq, max_seq, muted, "
        "joined_at) VALUES ($1, $2, $3, $4, $5, $6, 1)",
        [(m.conv_id, m.user_id, m.read_seq, m.min_seq, m.max_seq, m.muted) for m in members],
    )


# --------------------------------------------------------------------------- on head


@pytest.fixture(scope="module")
def head_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    from alembic import command

    pgs = start_postgres(tmp_path_factory.mktemp("blockspg") / "pg", fsync=False)
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


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_counts_from_blocks_equal_counting_every_message(
    head_pg: EmbeddedPostgres, db: asyncpg.Connection, seed: int
) -> None:
    rnd = random.Random(seed)
    convs = [f"g:{seed}{i:02d}" for i in range(8)]
    msgs = [m for c in convs for m in random_history(rnd, c)]
    last = {c: max(m.seq for m in msgs if m.conv_id == c) for c in convs}
    conv_min = {c: 1 if rnd.random() < 0.8 else rnd.randint(1, last[c]) for c in convs}
    members = [random_member(rnd, c, u, last[c]) for c in convs for u in USERS]
    # user ids are shared between seeds: each seed's users get ids of their own
    base = seed * 100
    for m in members:
        m.user_id += base
    for x in msgs:
        x.sender_id += base
        x.mentions = [u + base for u in x.mentions]
    await store(db, rnd, msgs)
    await setup_members(db, members, conv_min, last)

    stored, counted = await recount(db, convs)
    assert stored == counted
    async with sa_engine(head_pg) as engine, engine.connect() as conn:
        badges = await conv_states.badges(conn, [u + base for u in USERS])
        for u in USERS:
            rows, badge = expected(msgs, members, conv_min, u + base)
            got = await conv_states.unread(conn, u + base)
            assert (got.rows, got.badge) == (rows, badge), u
            assert badges[u + base] == badge
            states = await conv_states.states(conn, u + base, include_hidden=True)
            by_conv = {r[0]: (r[1], r[2]) for r in rows}
            assert {
                s["conv_id"]: (s["unread"], s["mention_unread"]) for s in states if s["unread"]
            } == by_conv


async def test_concurrent_writers_keep_the_blocks_exact(head_pg: EmbeddedPostgres) -> None:
    """Four connections persisting interleaved batches of the same conversations at once
    (as several persisters may, sharing the consumer group), replays included: every
    block holds exactly its rows, and no writer deadlocks."""
    rnd = random.Random(11)
    convs = [f"g:conc{i}" for i in range(5)]
    msgs = [m for c in convs for m in random_history(rnd, c)]
    for x in msgs:
        x.sender_id += 700
    rnd.shuffle(msgs)
    batches = [msgs[i : i + 25] for i in range(0, len(msgs), 25)]
    batches += rnd.sample(batches, len(batches) // 3)  # replays, racing the originals
    conns = [await asyncpg.connect(dsn(head_pg)) for _ in range(4)]
    try:

        async def writer(k: int) -> None:
            for b in batches[k::4]:
                await msg_store.persist_batch(conns[k], b, set(), [])

        await asyncio.wait_for(asyncio.gather(*(writer(k) for k in range(4))), 60)
        stored, counted = await recount(conns[0], convs)
        assert stored == counted and stored
    finally:
        for c in conns:
            await c.close()


async def test_deleted_rows_leave_their_blocks(db: asyncpg.Connection) -> None:
    rnd = random.Random(9)
    convs = ["g:deleted1", "g:deleted2"]
    msgs = [m for c in convs for m in random_history(rnd, c)]
    for x in msgs:
        x.sender_id += 900
    await store(db, rnd, msgs)
    await db.execute(
        "DELETE FROM messages WHERE conv_id = ANY($1) AND seq % 3 = 0 OR conv_id = $2",
        convs,
        convs[1],
    )
    stored, counted = await recount(db, convs)
    assert stored == counted


async def test_each_notice_type_is_left_out_of_the_blocks(db: asyncpg.Connection) -> None:
    """The trigger's list of notice types is the statement's NOT_COUNTED."""
    conv = "g:types"
    kinds = ["text", "image", "file", *conv_states.NOT_COUNTED]
    await store(
        db,
        random.Random(1),
        [
            NewMessage(conv, 63 + i, 950, f"types/{i}", t, "{}", 1, mentions=[951])
            for i, t in enumerate(kinds)
        ],
    )
    stored, counted = await recount(db, [conv])
    assert stored == counted == [(conv, 0, 1, 1), (conv, 1, 2, 2)]


# --------------------------------------------------------------------------- the migration


@contextlib.asynccontextmanager
async def migrated_db(
    tmp_path: Path, rev: str
) -> AsyncIterator[tuple[EmbeddedPostgres, asyncpg.Connection]]:
    """A PostgreSQL of the test's own, migrated to ``rev``, and a connection to it."""
    pgs = start_postgres(tmp_path / "pg", fsync=False)
    try:
        await migrate(pgs, rev)
        db = await asyncpg.connect(dsn(pgs))
        try:
            yield pgs, db
        finally:
            await db.close()
    finally:
        pgs.stop()


async def test_0021_fills_the_blocks_of_stored_messages(tmp_path: Path) -> None:
    async with migrated_db(tmp_path, "0020") as (pgs, db):
        rnd = random.Random(21)
        convs = [f"g:old{i}" for i in range(6)]
        msgs = [m for c in convs for m in random_history(rnd, c)]
        await store(db, rnd, msgs)  # the 0020 statement: no blocks yet
        assert not await db.fetchval("SELECT to_regclass('message_blocks') IS NOT NULL")
        last = {c: max(m.seq for m in msgs if m.conv_id == c) for c in convs}
        conv_min = dict.fromkeys(convs, 1)
        members = [random_member(rnd, c, u, last[c]) for c in convs for u in USERS]
        await setup_members(db, members, conv_min, last)

        await migrate(pgs, "0021")
        stored, counted = await recount(db, convs)
        assert stored == counted and stored
        include = await db.fetchval("SELECT pg_get_indexdef('messages_p00_sender'::regclass)")
        assert "INCLUDE (content_type)" in include
        async with sa_engine(pgs) as engine, engine.connect() as conn:
            for u in USERS:
                got = await conv_states.unread(conn, u)
                assert (got.rows, got.badge) == expected(msgs, members, conv_min, u)

        await migrate(pgs, "0020", down=True)
        assert not await db.fetchval("SELECT to_regclass('message_blocks') IS NOT NULL")
        plain = await db.fetchval("SELECT pg_get_indexdef('messages_p00_sender'::regclass)")
        assert "INCLUDE" not in plain
        await migrate(pgs, "head")
        stored, counted = await recount(db, convs)
        assert stored == counted


async def test_a_truncate_empties_the_blocks_it_leaves_without_messages(tmp_path: Path) -> None:
    """Migration 0022: a TRUNCATE of one partition takes the blocks of its conversations
    and no others; a TRUNCATE of ``messages`` takes them all; down and up again."""
    async with migrated_db(tmp_path, "head") as (pgs, db):
        rnd = random.Random(22)
        names = [f"g:trunc{i}" for i in range(400)]
        convs = []  # two conversations of each partition, so each trigger is tried
        for r in range(16):
            convs += await db.fetchval(
                "SELECT array_agg(c) FROM (SELECT c FROM unnest($1::text[]) AS c "
                "WHERE satisfies_hash_partition('messages'::regclass, 16, $2, c) LIMIT 2) t",
                names,
                r,
            )
        await store(db, rnd, [m for c in convs for m in random_history(rnd, c)])
        part = {
            c: str(
                await db.fetchval(
                    "SELECT tableoid::regclass FROM messages WHERE conv_id = $1 LIMIT 1", c
                )
            )
            for c in convs
        }
        assert len(set(part.values())) == 16 and len(convs) == 32
        cut = part[convs[0]]
        gone = [c for c in convs if part[c] == cut]
        kept = [c for c in convs if part[c] != cut]
        await db.execute(f"TRUNCATE {cut}")
        stored, counted = await recount(db, convs)
        assert stored == counted and stored  # the other partitions' blocks stay exact
        assert {r[0] for r in stored} <= set(kept)
        blocks = await db.fetchval(
            "SELECT count(*) FROM message_blocks WHERE conv_id = ANY($1)", gone
        )
        assert blocks == 0  # not even blocks of zeros

        await migrate(pgs, "0021", down=True)
        await db.execute("TRUNCATE messages")  # 0021 alone: the blocks stay behind
        assert await db.fetchval("SELECT count(*) FROM message_blocks") > 0
        await db.execute("TRUNCATE message_blocks")
        await migrate(pgs, "head")
        await store(db, rnd, [m for c in convs for m in random_history(rnd, c)])
        await db.execute("TRUNCATE messages")
        assert await db.fetchval("SELECT count(*) FROM message_blocks") == 0
