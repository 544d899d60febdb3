"""Crashes and restarts: kill -9 of the whole server, Redis restarted / flushed / killed,
graceful SIGTERM. Real processes, real stores (DESIGN.md invariants 1, 2, 3)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from im_server.client import Client, Connection
from im_server.client.transport import HttpPool, TransportError
from im_server.runtime.embedded import EmbeddedPostgres, read_password, start_redis
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    new_user,
    pg,
    rds,
)

STREAM = "im:stream:{p0}"


# --------------------------------------------------------------------------- helpers


def cmid(tag: str = "m") -> str:
    return f"{tag}-{uuid.uuid4().hex}"


async def send_ok(
    conn: Connection, conv: str, text: str, client_msg_id: str, *, retry_s: float = 10.0
) -> dict[str, Any]:
    """Send; retry the same client_msg_id while the server answers ``unavailable`` (a
    store reconnecting), as a real client would. Any other refusal is returned as is."""
    deadline = time.monotonic() + retry_s
    while True:
        ack = await conn.send(conv, text, client_msg_id=client_msg_id)
        if ack.get("ok") or ack.get("code") != "unavailable" or time.monotonic() > deadline:
            return ack
        print(f"\n[send retry] {client_msg_id}: {ack}")
        await asyncio.sleep(0.2)  # a client's retry pace, not a wait for a condition


async def all_history(client: Client, conv: str, page: int = 200) -> list[dict[str, Any]]:
    """Every visible message, paging forward through [begin, begin + page - 1]."""
    out: list[dict[str, Any]] = []
    begin = 1
    for _ in range(1000):
        r = await client.history(conv, begin=begin, end=begin + page - 1, limit=page, order="asc")
        out.extend(r["messages"])
        if r["is_end"] or begin + page - 1 >= r["max_seq"]:
            break
        begin += page
    return out


async def stream_depth(srv: ServerProcess) -> str:
    """XLEN of the embedded server's stream (its Redis port is in the start-up line, the
    password in the data folder)."""
    found = re.search(r"Redis redis://:\*\*\*@127\.0\.0\.1:(\d+)/0", srv.log_tail(200))
    if not found or srv.data_dir is None:
        return "?"
    password = read_password(srv.data_dir / "redis")
    r = aioredis.Redis(
        host="127.0.0.1", port=int(found.group(1)), password=password, decode_responses=True
    )
    try:
        return str(await r.xlen(STREAM))
    finally:
        await r.aclose()


def log_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return {"IM_TEST_LOG_DIR": str(logs), **extra}


@pytest.fixture
def dedicated_stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores.start(tmp_path / "stores")
    yield s
    s.stop()


async def rows_for(stores: Stores, sender_id: int, client_msg_id: str) -> list[asyncpg.Record]:
    async with pg(stores) as c:
        return list(
            await c.fetch(
                "SELECT conv_id, seq FROM messages WHERE sender_id = $1 AND client_msg_id = $2",
                sender_id,
                client_msg_id,
            )
        )


# --------------------------------------------------------------------------- a. kill -9


async def test_kill9_whole_server_keeps_every_acked_message(tmp_path: Path) -> None:
    """Embedded server (own PostgreSQL + Redis), 300 pipelined sends, kill -9 right after
    the last ack, restart on the same data dir: all 300 there exactly once, new seqs above
    every acked one, a resend of an old client_msg_id is a duplicate with its seq."""
    data = tmp_path / "data"
    env = log_env(tmp_path, IM_DATABASE_URL="", IM_REDIS_URL="", IM_NODE_NAME="crash-a")
    srv = ServerProcess(env=env, data_dir=data)
    srv2: ServerProcess | None = None
    t_start = time.monotonic()
    srv.start(timeout=120)
    first_ready = time.monotonic() - t_start
    try:
        a = await new_user(srv.url, "ka")
        b = await new_user(srv.url, "kb")
        conv = await befriend(a, b)
        conn = await a.connect()

        n, window = 300, 64
        ids = [cmid(f"k{i}") for i in range(n)]
        acks: dict[str, dict[str, Any]] = {}
        inflight: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []
        for i, m in enumerate(ids):
            fut = await conn.send_nowait(conv, f"msg {i}", client_msg_id=m)
            inflight.append((m, fut))
            if len(inflight) >= window:
                m0, f0 = inflight.pop(0)
                acks[m0] = await asyncio.wait_for(f0, 15)
        for m0, f0 in inflight:
            acks[m0] = await asyncio.wait_for(f0, 15)
        # crash at once: note how much was still only in the stream, then kill -9
        in_stream = await stream_depth(srv)
        srv.kill9()
        t_kill = time.monotonic()

        bad = {m: a_ for m, a_ in acks.items() if not a_.get("ok")}
        assert not bad, f"refused sends: {list(bad.values())[:3]}"
        assert all(x["duplicate"] is False for x in acks.values())
        acked = {m: int(x["seq"]) for m, x in acks.items()}
        assert len(set(acked.values())) == n, "two acks carried the same seq"
        await a.aclose()
        await b.aclose()

        srv2 = ServerProcess(env=env, data_dir=data)
        t0 = time.monotonic()
        await asyncio.to_thread(srv2.start, 120)
        restart_ready = time.monotonic() - t0
        print(
            f"\n[crash-restart] {in_stream} of {n} acked entries still in the stream at kill -9; "
            f"first start to ready {first_ready:.2f} s; "
            f"restart to ready {restart_ready:.2f} s; kill -9 to ready {time.monotonic() - t_kill:.2f} s"
        )

        a2 = await Client.login(srv2.url, str(a.username), PASSWORD)
        try:

            async def complete() -> list[dict[str, Any]] | None:
                msgs = await all_history(a2, conv, page=200)
                return msgs if len(msgs) >= n else None

            try:
                msgs = await eventually(complete, timeout=30, interval=0.2)
            except AssertionError:
                msgs = await all_history(a2, conv, page=200)
                raise AssertionError(
                    f"only {len(msgs)} of {n} acked messages in history after restart\n"
                    f"{srv2.log_tail()}"
                ) from None
            # a larger page must agree too
            big = (await a2.history(conv, begin=1, end=10_000, limit=500))["messages"]
            assert len(big) == len(msgs)

            seen = [(int(m["seq"]), m["client_msg_id"]) for m in msgs]
            assert len(seen) == n, f"{len(seen)} messages for {n} acked sends"
            assert len({s for s, _ in seen}) == n, "a seq appears twice in history"
            assert sorted(seen) == sorted((s, m) for m, s in acked.items()), (
                "history differs from the acked (seq, client_msg_id) pairs"
            )

            c2 = await a2.connect()
            top = max(acked.values())
            new_seqs = []
            for i in range(10):
                ack = await send_ok(c2, conv, f"after {i}", cmid("after"))
                assert ack["ok"] is True and ack["duplicate"] is False, ack
                new_seqs.append(int(ack["seq"]))
            assert min(new_seqs) > top, f"seq reused or went back: {new_seqs} vs acked max {top}"
            assert new_seqs == sorted(new_seqs) and len(set(new_seqs)) == 10

            old = ids[n // 2]
            dup = await send_ok(c2, conv, "again", old)
            assert dup["ok"] is True and dup["duplicate"] is True, dup
            assert int(dup["seq"]) == acked[old]
            await c2.close()
        finally:
            await a2.aclose()
    finally:
        if srv2 is not None:
            rc = srv2.terminate()
            if rc is None:
                print(srv2.log_tail())
        srv.kill9()
        # if the second server never came up, the first one's postmaster is still running
        leftover = EmbeddedPostgres(data_dir=(data / "pg").absolute(), port=0, url="")
        if leftover.pid() is not None:
            leftover.kill()


# --------------------------------------------------------------------------- b. Redis restart / flush


async def test_dedupe_survives_redis_restart_and_flush(
    dedicated_stores: Stores, tmp_path: Path
) -> None:
    stores = dedicated_stores
    srv = ServerProcess(env={**stores.env(), **log_env(tmp_path, IM_NODE_NAME="crash-b")}).start()
    try:
        a = await new_user(srv.url, "ra")
        b = await new_user(srv.url, "rb")
        conv = await befriend(a, b)
        conn = await a.connect()
        m1 = cmid("first")
        ack1 = await conn.send(conv, "first", client_msg_id=m1)
        assert ack1["ok"] is True and ack1["duplicate"] is False, ack1
        seq1 = int(ack1["seq"])

        # 1. Redis restarted with its data (AOF): the dedupe key is still there
        await asyncio.to_thread(stores.restart_redis)
        await asyncio.to_thread(srv.wait_ready, 30)
        again = await send_ok(conn, conv, "first", m1)
        assert again["ok"] is True and again["duplicate"] is True, (again, srv.log_tail())
        assert int(again["seq"]) == seq1

        more = []
        for i in range(3):
            ack = await send_ok(conn, conv, f"more {i}", cmid("more"))
            assert ack["ok"] is True and ack["duplicate"] is False, ack
            more.append((ack["client_msg_id"], int(ack["seq"])))
        seqs_before = [seq1] + [s for _, s in more]
        assert len(set(seqs_before)) == len(seqs_before)
        assert [s for _, s in more] == sorted(s for _, s in more) and more[0][1] > seq1

        # 2. Redis loses its data: wait until PostgreSQL has the messages, then FLUSHALL
        async def persisted() -> bool:
            for m, _s in [(m1, seq1), *more]:
                if len(await rows_for(stores, a.user_id or 0, m)) != 1:
                    return False
            return True

        await eventually(persisted, timeout=15)
        async with rds(stores) as r:
            await r.flushall()

        dup = await send_ok(conn, conv, "first", m1)
        assert dup["ok"] is True and dup["duplicate"] is True, (dup, srv.log_tail())
        assert int(dup["seq"]) == seq1
        last_m, last_s = more[-1]
        dup_last = await send_ok(conn, conv, "more 2", last_m)
        assert dup_last["ok"] is True and dup_last["duplicate"] is True, dup_last
        assert int(dup_last["seq"]) == last_s

        fresh = await send_ok(conn, conv, "after the flush", cmid("fresh"))
        assert fresh["ok"] is True and fresh["duplicate"] is False, fresh
        assert int(fresh["seq"]) > max(seqs_before), (
            f"seq reused after FLUSHALL: {fresh['seq']} <= {max(seqs_before)}"
        )

        # PostgreSQL: every client_msg_id exactly once, the new one too
        async def fresh_persisted() -> bool:
            return len(await rows_for(stores, a.user_id or 0, fresh["client_msg_id"])) == 1

        await eventually(fresh_persisted, timeout=15)
        for m, s in [(m1, seq1), *more]:
            rows = await rows_for(stores, a.user_id or 0, m)
            assert [(r["conv_id"], r["seq"]) for r in rows] == [(conv, s)]
        async with pg(stores) as c:
            dup_seqs = await c.fetch(
                "SELECT seq, count(*) FROM messages WHERE conv_id = $1 GROUP BY seq HAVING count(*) > 1",
                conv,
            )
        assert not dup_seqs
        await conn.close()
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()


async def test_keys_of_the_previous_layout_are_taken_over(
    dedicated_stores: Stores, tmp_path: Path
) -> None:
    """An upgrade from the layout whose keys were tagged by conversation (``im:seq:{conv}``,
    ``im:dd:<sender>:<cmid>``, one ``im:boot``) to the partition-tagged one: the new keys
    are missing, which the server treats as lost Redis data (the boot marker of the
    partition is absent), so repeats are answered from PostgreSQL and seqs continue
    above everything handed out before."""
    stores = dedicated_stores
    srv = ServerProcess(env={**stores.env(), **log_env(tmp_path, IM_NODE_NAME="crash-l")}).start()
    try:
        a = await new_user(srv.url, "la")
        b = await new_user(srv.url, "lb")
        conv = await befriend(a, b)
        conn = await a.connect()
        sent = []
        for i in range(3):
            ack = await send_ok(conn, conv, f"before {i}", cmid("old"))
            assert ack["ok"] is True and ack["duplicate"] is False, ack
            sent.append((ack["client_msg_id"], int(ack["seq"])))

        async def persisted() -> bool:
            for m, _s in sent:
                if len(await rows_for(stores, a.user_id or 0, m)) != 1:
                    return False
            return True

        await eventually(persisted, timeout=15)
        # put every key the sends made back under its name of the previous layout
        old_names = {
            r"im:boot:\{p0\}": "im:boot",
            r"im:dd:\{p0\}:(.*)": r"im:dd:\1",
            r"im:(seq|perm|pe|seqlk):\{p0\}:(.*)": r"im:\1:{\2}",
        }
        renamed = 0
        async with rds(stores) as r:
            for key in await r.keys("im:*"):
                for pattern, old in old_names.items():
                    if re.fullmatch(pattern, key):
                        await r.rename(key, re.sub(pattern, old, key))
                        renamed += 1
            assert await r.exists(f"im:seq:{{{conv}}}", "im:boot") == 2
        assert renamed >= 2 + len(sent)  # boot, seq and the dedupe keys at least

        for m, s in sent:
            dup = await send_ok(conn, conv, "again", m)
            assert dup["ok"] is True and dup["duplicate"] is True, (dup, srv.log_tail())
            assert int(dup["seq"]) == s
        fresh = await send_ok(conn, conv, "after the upgrade", cmid("new"))
        assert fresh["ok"] is True and fresh["duplicate"] is False, fresh
        assert int(fresh["seq"]) > max(s for _, s in sent)

        async def fresh_persisted() -> bool:
            return len(await rows_for(stores, a.user_id or 0, fresh["client_msg_id"])) == 1

        await eventually(fresh_persisted, timeout=15)
        for m, s in sent:
            rows = await rows_for(stores, a.user_id or 0, m)
            assert [(r["conv_id"], r["seq"]) for r in rows] == [(conv, s)]
        await conn.close()
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()


# --------------------------------------------------------------------------- c. Redis kill -9


async def test_stream_entries_survive_redis_kill9(dedicated_stores: Stores, tmp_path: Path) -> None:
    stores = dedicated_stores
    env = {**stores.env(), **log_env(tmp_path)}
    srv1 = ServerProcess(
        env={**env, "IM_RUN_PERSISTER": "false", "IM_NODE_NAME": "crash-c1"}
    ).start()
    srv2: ServerProcess | None = None
    try:
        a = await new_user(srv1.url, "xa")
        b = await new_user(srv1.url, "xb")
        conv = await befriend(a, b)
        conn = await a.connect()
        n = 40
        futs = [await conn.send_nowait(conv, f"s{i}", client_msg_id=cmid("s")) for i in range(n)]
        acks = [await asyncio.wait_for(f, 15) for f in futs]
        assert all(x["ok"] for x in acks), [x for x in acks if not x["ok"]][:3]
        acked = {x["client_msg_id"]: int(x["seq"]) for x in acks}
        assert len(set(acked.values())) == n
        async with rds(stores) as r:
            assert await r.xlen(STREAM) == n

        # kill -9 Redis right after the acks, restart it on its AOF, same port
        port = stores.redis.port
        stores.redis.kill()
        await conn.close()
        await a.aclose()
        await b.aclose()
        stores.redis = await asyncio.to_thread(start_redis, stores.root / "redis", port)
        srv1.terminate()

        srv2 = ServerProcess(env={**env, "IM_NODE_NAME": "crash-c2"})
        await asyncio.to_thread(srv2.start)

        async def rows() -> dict[str, int] | None:
            async with pg(stores) as c:
                got = await c.fetch(
                    "SELECT client_msg_id, seq FROM messages WHERE conv_id = $1", conv
                )
            return {r["client_msg_id"]: int(r["seq"]) for r in got} if len(got) >= n else None

        try:
            got = await eventually(rows, timeout=20, interval=0.1)
        except AssertionError:
            async with pg(stores) as c:
                cnt = await c.fetchval("SELECT count(*) FROM messages WHERE conv_id = $1", conv)
            async with rds(stores) as r:
                xl = await r.xlen(STREAM)
            raise AssertionError(
                f"{cnt} of {n} acked messages persisted after Redis kill -9 (XLEN {xl})\n"
                f"{srv2.log_tail()}"
            ) from None
        assert got == acked
        async with pg(stores) as c:
            assert await c.fetchval("SELECT count(*) FROM messages WHERE conv_id = $1", conv) == n

        async def drained() -> bool:
            async with rds(stores) as r:
                return await r.xlen(STREAM) == 0

        await eventually(drained, timeout=10)
    finally:
        srv1.terminate()
        if srv2 is not None:
            srv2.terminate()


# --------------------------------------------------------------------------- d. SIGTERM


async def test_sigterm_is_graceful(stores: Stores, tmp_path: Path) -> None:
    srv = ServerProcess(env={**stores.env(), **log_env(tmp_path, IM_NODE_NAME="crash-d")}).start()
    try:
        a = await new_user(srv.url, "ta")
        b = await new_user(srv.url, "tb")
        conv = await befriend(a, b)
        ca = await a.connect()
        cb = await b.connect()
        ack = await ca.send(conv, "before shutdown")
        assert ack["ok"] is True
        await cb.next_event("message")

        assert srv.proc is not None
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(srv.proc.wait, 15)
        took = time.monotonic() - t0
        print(f"\n[sigterm] exit {rc} after {took:.2f} s")
        for c in (ca, cb):
            await asyncio.wait_for(c.closed.wait(), 5)
            assert c.close_code in (1012, 1001), (c.close_code, c.close_reason)
        assert rc is not None and took < 8, f"graceful shutdown took {took:.1f} s"
        async with HttpPool() as h:
            with pytest.raises(TransportError):
                await h.get(srv.url + "/healthz", timeout=1)
        await a.aclose()
        await b.aclose()
        # last, so that the checks above are reported even when only the status is wrong
        assert rc == 0, f"exit status {rc} after SIGTERM\n{srv.log_tail()}"
    finally:
        srv.terminate()
