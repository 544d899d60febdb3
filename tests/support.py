"""Test support: real stores and real server processes.

``Stores`` starts an embedded PostgreSQL and Redis on free ports in a temp folder (the same
wheels the product uses). ``ServerProcess`` runs ``im-server serve`` as a child process
against given stores (or embedded ones under its own data folder), so tests exercise the
real command, real sockets and real crashes (kill -9)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import redis.asyncio as aioredis

from im_server.client import Client, Connection
from im_server.runtime.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    free_port,
    prepare_data_dir,
    start_postgres,
    start_redis,
)
from im_server.storage.db import run_migrations

# cheap password hashing, and rate limits far above what the tests send (the rate-limit
# and login-throttling tests start their own server with low limits); every test client
# is 127.0.0.1, so the per-address login limit would otherwise trip across tests
FAST_HASH_ENV = {
    "IM_ARGON2_TIME_COST": "1",
    "IM_ARGON2_MEMORY_KIB": "1024",
    "IM_RATE_SEND_BURST": "100000",
    "IM_RATE_READ_BURST": "100000",
    "IM_RATE_MEMBERS_BURST": "100000",
    "IM_LOGIN_FAIL_USER_MAX": "100000",
    "IM_LOGIN_FAIL_ADDR_MAX": "100000",
}
PASSWORD = "password-1234"


@dataclass
class Stores:
    root: Path
    pg: EmbeddedPostgres
    redis: EmbeddedRedis

    @classmethod
    def start(cls, root: Path, *, fsync: bool = False) -> Stores:
        root = prepare_data_dir(root)
        pg = start_postgres(root / "pg", fsync=fsync)
        rd = start_redis(root / "redis")
        run_migrations(pg.url)
        return cls(root, pg, rd)

    def restart_redis(self, *, kill: bool = False, port_same: bool = True) -> None:
        if kill:
            self.redis.kill()
        else:
            self.redis.stop()
        self.redis = start_redis(self.root / "redis", self.redis.port if port_same else None)

    def env(self) -> dict[str, str]:
        return {"IM_DATABASE_URL": self.pg.url, "IM_REDIS_URL": self.redis.url}

    def stop(self) -> None:
        self.redis.stop()
        self.pg.stop()


@dataclass
class ServerProcess:
    """``im-server serve`` in a child process (its own session, so kill -9 of its
    process group is a real crash of the whole thing)."""

    env: dict[str, str]
    port: int = 0
    data_dir: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        if not self.port:
            self.port = free_port()
        env = {**os.environ, **FAST_HASH_ENV, **self.env}
        env.setdefault("IM_NODE_NAME", f"test-{self.port}")
        args = [
            sys.executable,
            "-m",
            "im_server",
            "serve",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        if self.data_dir is not None:
            args += ["--data-dir", str(self.data_dir)]
        self.log_path = (
            Path(env.get("IM_TEST_LOG_DIR", "/tmp"))
            / f"im-server-{self.port}-{uuid.uuid4().hex[:6]}.log"
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/readyz", timeout=1.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def kill9(self) -> None:
        """SIGKILL the server's whole process group."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None


async def new_user(url: str, prefix: str = "u") -> Client:
    return await Client.register(url, f"{prefix}{uuid.uuid4().hex[:10]}", PASSWORD)


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


def pg_dsn(stores: Stores) -> str:
    return stores.pg.url.replace("postgresql+asyncpg", "postgresql")


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
