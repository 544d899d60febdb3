"""The persister against real stores, driven by hand: replays are idempotent, entries a
dead consumer left pending are reclaimed, and nothing is acknowledged before PostgreSQL
committed it (DESIGN.md invariants 1 and 2)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from im_server.client import Client, Connection
from im_server.runtime.embedded import start_postgres, start_redis
from tests.support import ServerProcess, Stores, befriend, eventually, new_user, pg, rds

STREAM = "im:stream:{p0}"
GROUP = "persist"


@pytest.fixture(scope="module")
def pstores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("pstores"))
    yield s
    s.stop()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


def server(stores: Stores, log_dir: Path, node: str, **extra: str) -> ServerProcess:
    env = {**stores.env(), "IM_TEST_LOG_DIR": str(log_dir), "IM_NODE_NAME": node, **extra}
    return ServerProcess(env=env)


async def conv_rows(stores: Stores, conv: str) -> list[tuple[int, str]]:
    async with pg(stores) as c:
        rows = await c.fetch(
            "SELECT seq, client_msg_id FROM messages WHERE conv_id = $1 ORDER BY seq", conv
        )
    return [(int(r["seq"]), r["client_msg_id"]) for r in rows]


async def xlen(stores: Stores) -> int:
    async with rds(stores) as r:
        return int(await r.xlen(STREAM))


async def pending_count(stores: Stores) -> int:
    async with rds(stores) as r:
        info = await r.xpending(STREAM, GROUP)
    return int(info["pending"])


async def send_many(conn: Connection, conv: str, n: int, tag: str) -> dict[str, int]:
    futs = [
        await conn.send_nowait(conv, f"{tag} {i}", client_msg_id=f"{tag}-{uuid.uuid4().hex}")
        for i in range(n)
    ]
    acks = [await asyncio.wait_for(f, 15) for f in futs]
    bad = [a for a in acks if not a.get("ok")]
    assert not bad, bad[:3]
    return {a["client_msg_id"]: int(a["seq"]) for a in acks}


async def friends(url: str) -> tuple[Client, Client, str]:
    a = await new_user(url, "pa")
    b = await new_user(url, "pb")
    return a, b, await befriend(a, b)


# --------------------------------------------------------------------------- a. replay


async def test_replayed_entry_is_idempotent(pstores: Stores, log_dir: Path) -> None:
    srv = server(pstores, log_dir, "pers-a").start()
    try:
        a, b, conv = await friends(srv.url)
        conn = await a.connect()
        text = "only once"
        ack = await conn.send(conv, text, client_msg_id=f"once-{uuid.uuid4().hex}")
        assert ack["ok"] is True, ack
        seq, cmid = int(ack["seq"]), ack["client_msg_id"]

        async def persisted() -> bool:
            return (seq, cmid) in await conv_rows(pstores, conv)

        await eventually(persisted, timeout=15)
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)

        # the very entry send_batch.lua wrote: q (seq), d (the send's fields joined by NUL)
        content = orjson.dumps({"text": text}).decode()
        parts = [conv, str(a.user_id), cmid, "text", content, str(ack["server_time"]), "0", "0"]
        fields: dict[str, Any] = {"q": seq, "d": "\0".join(parts)}
        async with rds(pstores) as r:
            await r.xadd(STREAM, fields)
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)
        await eventually(lambda: _is(pending_count(pstores), 0), timeout=10)
        assert await conv_rows(pstores, conv) == [(seq, cmid)]

        # twice more, in one go (both may land in the same batch)
        async with rds(pstores) as r:
            p = r.pipeline(transaction=False)
            p.xadd(STREAM, fields)
            p.xadd(STREAM, fields)
            await p.execute()
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)
        await eventually(lambda: _is(pending_count(pstores), 0), timeout=10)
        assert await conv_rows(pstores, conv) == [(seq, cmid)]
        async with pg(pstores) as c:
            row = await c.fetchrow(
                "SELECT sender_id, content::text AS content FROM messages WHERE conv_id = $1 AND seq = $2",
                conv,
                seq,
            )
        assert row is not None and row["sender_id"] == a.user_id
        assert orjson.loads(row["content"]) == {"text": text}
        # the persister claimed the dedupe key once, for the stored seq
        async with pg(pstores) as c:
            keys = await c.fetch(
                "SELECT conv_id, seq, server_time FROM message_dedupe "
                "WHERE sender_id = $1 AND client_msg_id = $2",
                a.user_id,
                cmid,
            )
        assert [tuple(k) for k in keys] == [(conv, seq, int(ack["server_time"]))]
        # replayed, not dropped as malformed (either way the rows would look the same)
        assert srv.log_path is not None
        assert "malformed stream entry" not in srv.log_path.read_text(errors="replace")

        # a seq handed out twice (never, by design): the stored message stays, and the
        # other message's key is not left claimed for a seq that shows something else
        other = f"other-{uuid.uuid4().hex}"
        parts2 = [conv, str(a.user_id), other, "text", content, str(ack["server_time"]), "0", "0"]
        async with rds(pstores) as r:
            await r.xadd(STREAM, {"q": seq, "d": "\0".join(parts2)})
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)
        await eventually(lambda: _is(pending_count(pstores), 0), timeout=10)
        assert await conv_rows(pstores, conv) == [(seq, cmid)]
        async with pg(pstores) as c:
            claimed = await c.fetchval(
                "SELECT count(*) FROM message_dedupe WHERE sender_id = $1 AND client_msg_id = $2",
                a.user_id,
                other,
            )
        assert claimed == 0
        assert "its seq holds another message" in srv.log_path.read_text(errors="replace")

        # the persister still works after the replays
        nxt = await conn.send(conv, "next", client_msg_id=f"next-{uuid.uuid4().hex}")
        assert nxt["ok"] is True and int(nxt["seq"]) == seq + 1, nxt

        async def next_persisted() -> bool:
            return len(await conv_rows(pstores, conv)) == 2

        await eventually(next_persisted, timeout=10)
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()


async def _is(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def _is_at_least(value: Any, expected: Any) -> bool:
    return bool((await value) >= expected)


# --------------------------------------------------------------------------- b. reclaim


async def test_stale_pending_entries_are_reclaimed(pstores: Stores, log_dir: Path) -> None:
    n = 25
    srv1 = server(pstores, log_dir, "pers-b1", IM_RUN_PERSISTER="false").start()
    srv2: ServerProcess | None = None
    try:
        async with rds(pstores) as r:
            with contextlib.suppress(aioredis.ResponseError):  # BUSYGROUP: exists already
                await r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        a, b, conv = await friends(srv1.url)
        conn = await a.connect()
        acked = await send_many(conn, conv, n, "ghost")
        await a.aclose()
        await b.aclose()

        # a consumer that reads and dies without acking
        async with rds(pstores) as r:
            got = await r.xreadgroup(GROUP, "ghost", {STREAM: ">"}, count=10 * n)
            entries = got[0][1] if got else []
            ours = [f for _i, f in entries if f["d"].split("\0")[0] == conv]
            assert len(ours) == n, f"ghost read {len(ours)} of {n} entries"
            summary = await r.xpending(STREAM, GROUP)
            assert summary["pending"] >= n
        assert await conv_rows(pstores, conv) == []
        srv1.terminate()

        srv2 = server(pstores, log_dir, "pers-b2", IM_PERSISTER_CLAIM_IDLE_MS="1000")
        await asyncio.to_thread(srv2.start)

        async def all_rows() -> bool:
            return len(await conv_rows(pstores, conv)) >= n

        try:
            await eventually(all_rows, timeout=15, interval=0.1)
        except AssertionError:
            raise AssertionError(
                f"{len(await conv_rows(pstores, conv))} of {n} reclaimed\n{srv2.log_tail()}"
            ) from None
        assert sorted(await conv_rows(pstores, conv)) == sorted((s, m) for m, s in acked.items())
        await eventually(lambda: _is(pending_count(pstores), 0), timeout=10)
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)
    finally:
        srv1.terminate()
        if srv2 is not None:
            srv2.terminate()


# --------------------------------------------------------------------------- c. PG down


async def test_persister_commits_before_acking(pstores: Stores, log_dir: Path) -> None:
    srv = server(pstores, log_dir, "pers-c", IM_PERSISTER_CLAIM_IDLE_MS="2000").start()
    pg_port = pstores.pg.port
    try:
        a, b, conv = await friends(srv.url)
        conn = await a.connect()
        warm = await send_many(conn, conv, 1, "warm")  # seq block + permissions in Redis

        async def warm_persisted() -> bool:
            return len(await conv_rows(pstores, conv)) == 1

        await eventually(warm_persisted, timeout=10)
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)

        await asyncio.to_thread(pstores.pg.stop)
        try:
            n = 30
            acked = await send_many(conn, conv, n // 2, "down")
            # the persister has read from the stream (pending in its group) and its commit
            # fails; it retries that batch first, with backoff, before it reads more
            await eventually(lambda: _is_at_least(pending_count(pstores), 1), timeout=10)
            acked |= await send_many(conn, conv, n - n // 2, "down")
            await asyncio.sleep(0.7)  # under test: nothing is acknowledged meanwhile
            depth = await xlen(pstores)
            assert depth == n, f"XLEN {depth} with PostgreSQL down, {n} acked messages queued"
        finally:
            pstores.pg = await asyncio.to_thread(
                start_postgres, pstores.root / "pg", pg_port, fsync=False
            )

        expected = sorted([*((s, m) for m, s in warm.items()), *((s, m) for m, s in acked.items())])

        async def all_rows() -> bool:
            return len(await conv_rows(pstores, conv)) >= n + 1

        try:
            await eventually(all_rows, timeout=25, interval=0.2)
        except AssertionError:
            raise AssertionError(
                f"{len(await conv_rows(pstores, conv))} of {n + 1} persisted after PostgreSQL "
                f"came back (XLEN {await xlen(pstores)})\n{srv.log_tail()}"
            ) from None
        assert await conv_rows(pstores, conv) == expected
        await eventually(lambda: _is(xlen(pstores), 0), timeout=10)
        await eventually(lambda: _is(pending_count(pstores), 0), timeout=10)
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()


async def test_partitions_split_the_stream_and_keep_every_guarantee(
    pstores: Stores, log_dir: Path, tmp_path: Path
) -> None:
    """With IM_STREAM_PARTITIONS=4 a burst to conversations of several partitions: each
    send lands in its conversation's partition (stream and keys under one tag), seqs stay
    contiguous per conversation, a repeat is a duplicate, and everything is stored once."""
    from im_server.storage.redis import keys

    def cm(conv: str, i: int) -> str:
        return f"pt-{conv.replace(':', '_')}-{i}"

    parts = 4
    # a keyspace of its own: the module's keyspace has its partition count recorded (1)
    own = dataclasses.replace(pstores, redis=start_redis(tmp_path / "redis"))
    srv = server(own, log_dir, "p-parts", IM_STREAM_PARTITIONS=str(parts)).start()
    try:
        a = await new_user(srv.url, "pa")
        friends = [await new_user(srv.url, "pf") for _ in range(8)]
        convs = [await befriend(a, f) for f in friends]
        used = {keys.partition_of(c, parts) for c in convs}
        assert len(used) >= 2, "the conversations should spread over partitions"
        conn = await a.connect()
        acks = await asyncio.gather(
            *(conn.send(c, f"m{i}", client_msg_id=cm(c, i)) for c in convs for i in range(5))
        )
        assert all(ack["ok"] and not ack["duplicate"] for ack in acks), acks
        for c in convs:
            seqs = sorted(int(ack["seq"]) for ack in acks if ack["conv_id"] == c)
            assert seqs == list(range(seqs[0], seqs[0] + 5)), (c, seqs)
        again = await conn.send(convs[0], "m0", client_msg_id=cm(convs[0], 0))
        first = next(x for x in acks if x["client_msg_id"] == cm(convs[0], 0))
        assert again["duplicate"] is True and again["seq"] == first["seq"]

        async with rds(own) as r:
            for p in range(parts):
                for _id, fields in await r.xrange(keys.stream(p)):
                    conv = fields["d"].split("\0", 1)[0]
                    if conv in convs:
                        assert keys.partition_of(conv, parts) == p, (conv, p)
            for c in convs:
                cur = await r.hget(keys.seq(keys.partition_of(c, parts), c), "cur")
                assert cur is not None and int(cur) >= 5

        async def stored() -> bool:
            return [len(await conv_rows(own, c)) for c in convs] == [5] * len(convs)

        await eventually(stored, timeout=20)
        for c in convs:
            rows = await conv_rows(own, c)
            assert sorted(m for _, m in rows) == sorted(cm(c, i) for i in range(5))
        await conn.close()
        await a.aclose()
        for f in friends:
            await f.aclose()
    finally:
        srv.terminate()
        own.redis.stop()
