"""How the send path sees its stores fail, and the dedupe look-up in PostgreSQL used while
a Redis that lost its data may have forgotten recent sends."""

from __future__ import annotations

import asyncpg
from redis.exceptions import RedisError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.context import DedupeChecker
from im_server.context.batching import Coalescer
from im_server.errors import is_store_error
from im_server.storage import messages as msg_store
from im_server.storage.redis.replies import SendDuplicate


def failed_store(e: BaseException) -> str | None:
    """Which store ``e`` says is unreachable or failing: 'redis', 'postgres', or None when
    it is neither (a bug, which must surface as one rather than as `unavailable`).
    Redis errors all come wrapped by redis-py; a bare OSError or timeout here comes from
    the PostgreSQL driver connecting."""
    if isinstance(e, RedisError):
        return "redis"
    if isinstance(e, _PG_FAILURES) or is_store_error(e):
        return "postgres"
    return None


_PG_FAILURES = (
    OperationalError,
    InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,  # shutting down, starting up, statement timeout
)


def dedupe_checker(engine: AsyncEngine) -> DedupeChecker:
    """Looks (sender, client_msg_id) pairs up in PostgreSQL, many per query: used only
    while a Redis that lost its data may have forgotten recent sends."""

    async def run(pairs: list[tuple[int, str]]) -> list[SendDuplicate | None]:
        async with engine.connect() as conn:
            found = await msg_store.by_dedupe_keys(conn, pairs)
        out: list[SendDuplicate | None] = []
        for p in pairs:
            hit = found.get(p)
            out.append(SendDuplicate(*hit) if hit is not None else None)
        return out

    return Coalescer(run, 500)
