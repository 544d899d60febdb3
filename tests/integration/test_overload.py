"""Overload is answered, not crashed through: a storm of long polls of one user is bounded
(the excess answered 429 at once), a saturated connection pool is ``503 unavailable``
with the contract's body and no traceback in the log, and other users go on meanwhile.
A dedicated server with a tiny pool and a short store timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from im_server.client.transport import HttpPool, Response
from tests.support import ServerProcess, Stores, new_user, pg

POLLS_PER_USER = 4


@pytest.fixture(scope="module")
def tight(stores: Stores) -> Iterator[ServerProcess]:
    env = {
        **stores.env(),
        "IM_DB_POOL_SIZE": "2",
        "IM_DB_POOL_OVERFLOW": "0",
        "IM_STORE_TIMEOUT_SECONDS": "0.5",
        "IM_SYNC_LONG_POLLS_PER_USER": str(POLLS_PER_USER),
    }
    srv = ServerProcess(env=env).start()
    yield srv
    srv.terminate()


def _log(srv: ServerProcess) -> str:
    assert srv.log_path is not None
    return Path(srv.log_path).read_text(errors="replace")


def _no_traceback(srv: ServerProcess) -> None:
    text = _log(srv)
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]


async def test_a_storm_of_long_polls_of_one_user_is_bounded(tight: ServerProcess) -> None:
    me, other = await new_user(tight.url, "storm"), await new_user(tight.url, "calm")
    try:
        since = (await me.sync(since=0))["version"]
        headers = {"Authorization": f"Bearer {me.token}"}
        async with HttpPool(timeout=60, max_connections=300) as h:

            async def poll() -> Response:
                return await h.get(
                    tight.url + "/v1/sync", params={"since": since, "wait": "3"}, headers=headers
                )

            storm = [asyncio.create_task(poll()) for _ in range(200)]
            # the excess is answered at once, before the polls that wait are done
            refused = 0
            for t in asyncio.as_completed(storm):
                r = await t
                if r.status_code == 429:
                    refused += 1
                if refused == 200 - POLLS_PER_USER:
                    break
            # another user is served normally, and fast, during the storm
            started = time.monotonic()
            assert (await other.conversations()) == []
            assert (await other.sync(since=0))["conversations"] == []
            assert time.monotonic() - started < 2.0
            answers = await asyncio.gather(*storm)
        codes = sorted(r.status_code for r in answers)
        assert codes.count(429) == 200 - POLLS_PER_USER, codes
        assert codes.count(200) == POLLS_PER_USER, codes
        for r in answers:
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "rate_limited", r.text
            else:
                assert r.json()["version"] == since, r.text
        _no_traceback(tight)
    finally:
        await me.aclose()
        await other.aclose()


async def test_a_saturated_pool_is_a_clean_503(tight: ServerProcess, stores: Stores) -> None:
    me = await new_user(tight.url, "pool")
    try:
        assert await me.conversations() == []  # the token is checked (and cached) now
        headers = {"Authorization": f"Bearer {me.token}"}
        async with pg(stores) as db, HttpPool(timeout=60) as h:
            # every read of the conversations waits on this lock: two requests hold the
            # pool's two connections, the others wait for one past the store timeout
            tx = db.transaction()
            await tx.start()
            await db.execute("LOCK TABLE conv_members IN ACCESS EXCLUSIVE MODE")
            try:
                calls = [
                    asyncio.create_task(h.get(tight.url + "/v1/conversations", headers=headers))
                    for _ in range(12)
                ]
                done, _ = await asyncio.wait(calls, timeout=10, return_when=asyncio.FIRST_COMPLETED)
                assert done, "nothing answered while the pool was held"
            finally:
                await tx.rollback()
            answers = await asyncio.gather(*calls)
        codes = [r.status_code for r in answers]
        assert 503 in codes and set(codes) <= {200, 503}, codes
        for r in answers:
            if r.status_code == 503:
                assert r.json() == {
                    "error": {"code": "unavailable", "message": "a store is unavailable, try again"}
                }, r.text
        _no_traceback(tight)
        # a few lines at most, not one per refusal
        assert 1 <= _log(tight).count("answered 503 unavailable") <= 3
        assert await me.conversations() == []  # and it serves again
    finally:
        await me.aclose()
