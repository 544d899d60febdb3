"""The send's slow path tells a store that is down from a bug: with PostgreSQL
unreachable, the first send of a new chat (which needs a seq block reserved there) is
refused with ``unavailable``, counted as a PostgreSQL error and logged without a
traceback; the process stays up, and the send goes through, with the chat's first seq,
once PostgreSQL is back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from im_server.runtime.embedded import start_postgres
from tests.support import ServerProcess, Stores, befriend, eventually, metric, new_user


async def test_a_seq_block_without_postgres_is_unavailable(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv = ServerProcess(env={**stores.env(), "IM_STORE_TIMEOUT_SECONDS": "1"}).start()
    try:
        a, b, c = [await new_user(srv.url, p) for p in ("fa", "fb", "fc")]
        old_chat = await befriend(a, b)
        new_chat = await befriend(a, c)
        ca = await a.connect()
        assert (await ca.send(old_chat, "warm"))["ok"]
        before = await asyncio.to_thread(metric, srv.url, 'im_store_errors_total{store="postgres"}')
        port = stores.pg.port
        stores.pg.stop()

        t0 = time.monotonic()
        refused = await ca.send(new_chat, "the first of a new chat, database down")
        took = time.monotonic() - t0
        assert refused["ok"] is False and refused["code"] == "unavailable", refused
        assert "database" in refused["message"], refused
        assert took < 10, took
        assert (
            await asyncio.to_thread(metric, srv.url, 'im_store_errors_total{store="postgres"}')
            >= before + 1
        )
        assert srv.proc is not None and srv.proc.poll() is None
        log = srv.log_tail(300)
        assert "could not complete" in log and "Traceback" not in log
        # the chat with a seq block in Redis still works
        assert (await ca.send(old_chat, "still here"))["ok"]

        stores.pg = start_postgres(stores.root / "pg", port)

        async def sent() -> int:
            with contextlib.suppress(Exception):
                ack = await ca.send(new_chat, "database back")
                return int(ack["seq"]) if ack["ok"] else 0
            return 0

        assert await eventually(sent, timeout=20) == 1  # the refused send took no seq
        await ca.close()
        for u in (a, b, c):
            await u.aclose()
    finally:
        srv.terminate()
        stores.stop()
