"""IM_DATABASE_URL takes the usual spellings of a PostgreSQL URL (PROTOCOL.md,
Operations): ``postgresql://``, ``postgres://`` and ``postgresql+asyncpg://`` all start
the server, run its migrations, and reach every path that talks to the database (the
pooled engine of the REST calls and the persister's own connection)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from im_server.config import asyncpg_url
from tests.support import ServerProcess, Stores, befriend, new_user, persisted, send_ok


def _spelled(url: str, scheme: str) -> str:
    return scheme + asyncpg_url(url).split("://", 1)[1]


@pytest.mark.parametrize("scheme", ["postgresql://", "postgres://", "postgresql+asyncpg://"])
async def test_each_spelling_serves(stores: Stores, scheme: str) -> None:
    db_url = _spelled(stores.pg.url, scheme)
    env = {**stores.env(), "IM_DATABASE_URL": db_url}
    migrate = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "im_server", "migrate"],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    srv = ServerProcess(env=env).start()
    try:
        a, b = await new_user(srv.url), await new_user(srv.url)
        conv = await befriend(a, b)
        seq = await send_ok(a, conv, f"over {scheme}")
        await persisted(b, conv, seq)  # the persister wrote it on its own connection
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate()
