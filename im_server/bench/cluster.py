"""Stores and servers that a benchmark, the chaos harness or a test starts for itself.

``Stores`` starts an embedded PostgreSQL, Redis and S3 store (SeaweedFS) on free ports in a
temp folder (the same wheels the product uses). ``ServerProcess`` runs ``im-server serve`` as a child process
against given stores (or embedded ones under its own data folder), so callers exercise the
real command, real sockets and real crashes (kill -9). The test suite imports them from
``tests/support.py``; they live in the package so that the harnesses built on them can be
imported without the test suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from im_server.client.transport import TransportError, request_sync
from im_server.runtime.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedS3,
    free_port,
    prepare_data_dir,
    start_postgres,
    start_redis,
    start_s3,
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
    # every test user is registered, looked up and befriended from 127.0.0.1
    "IM_REGISTER_ADDR_MAX": "1000000",
    "IM_LOOKUP_USER_MAX": "100000",
    "IM_LOOKUP_ADDR_MAX": "1000000",
    "IM_FRIEND_REQUEST_USER_MAX": "100000",
}


@dataclass
class Stores:
    root: Path
    pg: EmbeddedPostgres
    redis: EmbeddedRedis
    s3: EmbeddedS3

    @classmethod
    def start(cls, root: Path, *, fsync: bool = False) -> Stores:
        root = prepare_data_dir(root)
        pg = start_postgres(root / "pg", fsync=fsync)
        try:
            rd = start_redis(root / "redis")
            try:
                s3 = start_s3(root / "s3")
            except BaseException:
                rd.stop()
                raise
        except BaseException:
            pg.stop()
            raise
        run_migrations(pg.url)
        return cls(root, pg, rd, s3)

    def restart_redis(self, *, kill: bool = False, port_same: bool = True) -> None:
        if kill:
            self.redis.kill()
        else:
            self.redis.stop()
        self.redis = start_redis(self.root / "redis", self.redis.port if port_same else None)

    def env(self) -> dict[str, str]:
        return {"IM_DATABASE_URL": self.pg.url, "IM_REDIS_URL": self.redis.url, **self.s3.env()}

    def stop(self) -> None:
        self.s3.stop()
        self.redis.stop()
        self.pg.stop()


def pg_dsn(stores: Stores) -> str:
    """The stores' PostgreSQL URL for plain asyncpg (no SQLAlchemy driver suffix)."""
    return stores.pg.url.replace("postgresql+asyncpg", "postgresql")


class PortTaken(RuntimeError):
    """The server's port was taken by another process before the server could bind it."""


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
    # one process by default, so that ``proc`` is the process serving (kill -9 of it is a
    # crash of the server); more share the port as ``serve --workers N`` does
    workers: int = 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Start and wait until ready. A port chosen here (none was given) may be taken
        by another process before the server binds it (suites running side by side):
        then the server is started again on another one."""
        chosen = not self.port
        for attempt in range(4):
            if chosen:
                self.port = free_port()
            try:
                return self._start(timeout)
            except PortTaken:
                if not chosen or attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> ServerProcess:
        env = {**os.environ, **FAST_HASH_ENV, **self.env}
        if not env.get("IM_S3_ENDPOINT") and self.data_dir is None:
            # serve would start its own S3 store in ./.im-data, shared with whoever else
            raise ValueError("a server with no IM_S3_ENDPOINT needs a data_dir of its own")
        env.setdefault("IM_NODE_NAME", f"test-{self.port}")
        args = [
            sys.executable,
            "-m",
            "im_server",
            "serve",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
            *self.extra_args,
        ]
        if self.data_dir is not None:
            args += ["--data-dir", str(self.data_dir)]
        self.log_path = (
            Path(env.get("IM_TEST_LOG_DIR", "/tmp"))
            / f"im-server-{self.port}-{uuid.uuid4().hex[:6]}.log"
        )
        log = open(self.log_path, "ab")  # owned by the child
        self.proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``/readyz`` answers 200 from this server: the port is checked to be held
        by this process (or one of its workers), not by another that took it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                if "address already in use" in self.log_tail().lower():
                    raise PortTaken(self.port)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = request_sync("GET", self.url + "/readyz", timeout=1.0)
                if r.status_code == 200 and self._listens():
                    return
            except TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    def _listens(self) -> bool:
        if self.proc is None:
            return False
        try:
            me = psutil.Process(self.proc.pid)
            procs = [me, *me.children(recursive=True)]
            return any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                for p in procs
                for c in p.net_connections("inet")
            )
        except psutil.Error:
            return False

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
