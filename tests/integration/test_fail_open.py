"""Permission lookups fail open only where the contract says so: with PostgreSQL
unreachable or stalled, a single-chat send whose friendship check cannot be answered is
let through, logged and counted; a group send whose membership cannot be checked is
refused with ``unavailable`` (a kicked member must never get a message in)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis.asyncio as aioredis

from im_server.client import ApiError
from im_server.client.transport import request_sync
from im_server.runtime.embedded import start_postgres
from im_server.storage.redis import keys as redis_keys
from tests.support import (
    ServerProcess,
    Stores,
    befriend,
    eventually,
    metric,
    new_user,
    persisted,
    rds,
)


async def test_send_is_let_through_when_the_lookup_fails(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv = ServerProcess(env=stores.env()).start()
    try:
        a, b = await new_user(srv.url), await new_user(srv.url)
        conv = await befriend(a, b)
        ca = await a.connect()
        first = await ca.send(conv, "before")  # warms the seq block
        assert first["ok"]
        r = aioredis.Redis.from_url(stores.redis.url, decode_responses=True)
        await r.delete(redis_keys.perm(0, conv))  # the cached answer is gone: a lookup is needed
        before = metric(srv.url, "im_permission_lookup_failures_total")
        port = stores.pg.port
        stores.pg.stop()
        ack = await ca.send(conv, "while the database is down")
        assert ack["ok"] is True and ack["seq"] == first["seq"] + 1
        assert metric(srv.url, "im_permission_lookup_failures_total") >= before + 1
        assert "letting the send through" in srv.log_tail(200)
        # the process stays up, says it is not ready, and answers reads with 503 at once
        assert (
            await asyncio.to_thread(request_sync, "GET", srv.url + "/healthz")
        ).status_code == 200
        ready = await asyncio.to_thread(request_sync, "GET", srv.url + "/readyz")
        assert ready.status_code == 503 and ready.json()["postgres"] is False
        t0 = time.monotonic()
        with pytest.raises(ApiError) as e:
            await b.history(conv)
        assert e.value.status == 503 and e.value.code == "unavailable"
        assert time.monotonic() - t0 < 5
        stores.pg = start_postgres(stores.root / "pg", port)

        async def both() -> bool:
            try:
                msgs = (await b.history(conv))["messages"]
            except Exception:  # noqa: BLE001 - the pool reconnects
                return False
            return [m["seq"] for m in msgs] == [1, 2]

        await eventually(both, timeout=20)
        await r.aclose()
        await ca.close()
    finally:
        srv.terminate()
        stores.stop()


@contextlib.contextmanager
def stalled_postgres(stores: Stores) -> Iterator[None]:
    """Every process of the cluster stopped (SIGSTOP): connections open, queries hang,
    as with a database that stopped answering."""
    pid = stores.pg.pid()
    assert pid is not None
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)


async def test_group_send_is_refused_when_membership_cannot_be_checked(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv = ServerProcess(env={**stores.env(), "IM_STORE_TIMEOUT_SECONDS": "1"}).start()
    try:
        owner, member, kicked = [await new_user(srv.url, p) for p in ("own", "mem", "kck")]
        g = await owner.create_group("g", [member.user_id, kicked.user_id])  # type: ignore[list-item]
        conv = g["conv_id"]
        ack = await owner.send_rest(conv, "before")
        assert ack["ok"]
        await owner.kick(g["group_id"], kicked.user_id)  # type: ignore[arg-type]
        end = (await owner.send_rest(conv, "after the kick"))["seq"]
        await persisted(owner, conv, end)
        ck, cm = await kicked.connect(), await member.connect()
        async with rds(stores) as r:
            before = metric(srv.url, "im_permission_lookup_failures_total")
            # stopped: the lookup fails at once
            await r.delete(redis_keys.perm(0, conv))
            port = stores.pg.port
            stores.pg.stop()
            for c in (ck, cm):
                refused = await c.send(conv, "while the database is down")
                assert refused["ok"] is False and refused["code"] == "unavailable", refused
            stores.pg = start_postgres(stores.root / "pg", port)
            # stalled: the lookup times out after the store timeout, and is refused too
            await eventually(lambda: _ready(srv.url), timeout=20)
            await r.delete(redis_keys.perm(0, conv))
            with stalled_postgres(stores):
                t0 = time.monotonic()
                refused = await ck.send(conv, "while the database hangs")
                took = time.monotonic() - t0
            assert refused["ok"] is False and refused["code"] == "unavailable", refused
            assert took < 10, took
            assert metric(srv.url, "im_permission_lookup_failures_total") >= before + 3
            assert "refusing the send" in srv.log_tail(400)

        # nothing of it was stored or took a seq; rights come back with the database
        async def member_sends() -> int:
            with contextlib.suppress(Exception):
                ack = await cm.send(conv, "back")
                return int(ack["seq"]) if ack["ok"] else 0
            return 0

        back = await eventually(member_sends, timeout=20)
        assert back == end + 1
        await persisted(owner, conv, back)
        page = await owner.history(conv, begin=end + 1)
        assert [(m["seq"], m["content"]["text"]) for m in page["messages"]] == [(back, "back")]
        late = await ck.send(conv, "kicked, with the database back")
        assert late["ok"] is False and late["code"] == "not_member", late
        await ck.close()
        await cm.close()
    finally:
        srv.terminate()
        stores.stop()


async def _ready(url: str) -> bool:
    r = await asyncio.to_thread(request_sync, "GET", url + "/readyz")
    return r.status_code == 200
