"""Permission lookups fail open: with PostgreSQL unreachable, a send whose friendship
check cannot be answered is let through, logged and counted."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from im_server.client import ApiError
from im_server.runtime.embedded import start_postgres
from tests.support import ServerProcess, Stores, befriend, eventually, new_user


def _failures(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    for line in text.splitlines():
        if line.startswith("im_permission_lookup_failures_total "):
            return float(line.split()[1])
    return 0.0


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
        await r.delete(f"im:perm:{{{conv}}}")  # the cached answer is gone: a lookup is needed
        before = _failures(srv.url)
        port = stores.pg.port
        stores.pg.stop()
        ack = await ca.send(conv, "while the database is down")
        assert ack["ok"] is True and ack["seq"] == first["seq"] + 1
        assert _failures(srv.url) >= before + 1
        assert "letting the send through" in srv.log_tail(200)
        # the process stays up, says it is not ready, and answers reads with 503 at once
        assert (await asyncio.to_thread(httpx.get, srv.url + "/healthz")).status_code == 200
        ready = await asyncio.to_thread(httpx.get, srv.url + "/readyz")
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
