"""Test support: real stores and real server processes (``Stores`` and ``ServerProcess``,
from :mod:`im_server.bench.cluster`), users, and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from im_server.bench.cluster import FAST_HASH_ENV as FAST_HASH_ENV
from im_server.bench.cluster import ServerProcess as ServerProcess
from im_server.bench.cluster import Stores, pg_dsn
from im_server.client import Client

PASSWORD = "password-1234"


async def new_user(url: str, prefix: str = "u") -> Client:
    return await Client.register(url, f"{prefix}{uuid.uuid4().hex[:10]}", PASSWORD)


async def befriend(a: Client, b: Client) -> str:
    rid = await a.request_friend(b.user_id)  # type: ignore[arg-type]
    return await b.accept_friend(rid)


async def eventually(fn: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Await ``fn()`` until it returns a truthy value (the persister is asynchronous)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s (last: {last!r})")


async def persisted(c: Client, conv: str, seq: int, timeout: float = 15.0) -> None:
    """Wait until ``seq`` is in PostgreSQL, seen through a member whose window has it."""

    async def ok() -> bool:
        return int((await c.history(conv, limit=1, order="desc"))["max_seq"]) >= seq

    await eventually(ok, timeout=timeout)


@contextlib.asynccontextmanager
async def pg(stores: Stores) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to the test stores, for checks behind the server."""
    conn = await asyncpg.connect(pg_dsn(stores))
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def rds(stores: Stores) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(stores.redis.url, decode_responses=True)
    try:
        yield r
    finally:
        await r.aclose()


async def send_ok(c: Client, conv: str, text: str) -> int:
    """Send over REST, assert it was accepted, return the seq."""
    ack = await c.send_rest(conv, text)
    assert ack["ok"] is True, ack
    return int(ack["seq"])
