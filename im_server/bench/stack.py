"""The load benchmark's local stack: stores, server and echo processes in a temp folder,
their CPU accounted (``Procs``, ``Local``), and many users registered at once. Shared by
the load, scaling, group and idle modes of ``im-server bench``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from im_server.client.transport import TransportError, request_sync

console = Console(stderr=True)
BENCH_ENV = {
    "IM_MAX_CONNECTIONS_PER_USER": "1000000",
    "IM_ARGON2_TIME_COST": "1",
    "IM_ARGON2_MEMORY_KIB": "1024",
    "IM_RATE_SEND_PER_S": "0",
    "IM_RATE_READ_PER_S": "0",
    "IM_RATE_TYPING_PER_S": "0",
    # a benchmark makes its users from one address, many more than a person would
    "IM_REGISTER_ADDR_MAX": "1000000",
    "IM_FRIEND_REQUEST_USER_MAX": "1000000",
    "IM_LOOKUP_USER_MAX": "1000000",
    "IM_LOOKUP_ADDR_MAX": "1000000",
    "IM_LOG_LEVEL": "WARNING",
}


@dataclass
class Procs:
    """Server-side processes whose CPU time is counted."""

    pids: list[int] = field(default_factory=list)
    tree_roots: list[int] = field(default_factory=list)  # counted with all descendants

    def cpu(self) -> float:
        total = 0.0
        seen: set[int] = set()
        procs: list[psutil.Process] = []
        for pid in self.pids:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        for pid in self.tree_roots:
            try:
                root = psutil.Process(pid)
                procs.append(root)
                procs.extend(root.children(recursive=True))
            except psutil.Error:
                pass
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def rss(self) -> int:
        total = 0
        for pid in self.pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return total


def free_port() -> int:
    from im_server.runtime.embedded import free_port as fp

    return fp()


def wait_http(url: str, path: str = "/readyz", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if request_sync("GET", url + path, timeout=1).status_code == 200:
                return
        except TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not ready")


def wait_port(port: int, timeout: float = 30) -> None:
    from im_server.runtime.embedded import wait_for_port

    wait_for_port("127.0.0.1", port, timeout)


class Local:
    """Stores + im-server + echo, started by the bench itself: a single Valkey, or a
    Valkey Cluster of ``cluster`` primaries with a replica each; ``gateways`` server
    processes (receivers connect to the last one, so with two a message crosses
    processes), each ``serve --workers workers``; ``partitions`` stream partitions.
    ``split_persister``: the persister runs as a process of its own (``im-server
    persister``, the servers with ``IM_RUN_PERSISTER=false``), so its CPU is a figure of
    its own rather than part of the gateway's."""

    def __init__(
        self,
        root: Path,
        *,
        cluster: int = 0,
        gateways: int = 1,
        partitions: int = 1,
        workers: int = 1,
        split_persister: bool = False,
    ) -> None:
        from im_server.runtime.embedded import start_postgres, start_redis, start_s3
        from im_server.runtime.valkey_cluster import EmbeddedCluster, start_cluster
        from im_server.storage.db import run_migrations

        self.pg = start_postgres(root / "pg", fsync=True)
        self.cluster: EmbeddedCluster | None = None
        self.redis = None
        if cluster:
            self.cluster = start_cluster(root / "valkey", primaries=cluster)
            redis_url = self.cluster.url
        else:
            self.redis = start_redis(root / "redis")
            redis_url = self.redis.url
        self.redis_url = redis_url
        self.partitions = partitions
        self.s3 = start_s3(root / "s3")
        run_migrations(self.pg.url)
        env = {
            **os.environ,
            **BENCH_ENV,
            "IM_DATABASE_URL": self.pg.url,
            "IM_REDIS_URL": redis_url,
            "IM_REDIS_CLUSTER": "true" if cluster else "false",
            "IM_STREAM_PARTITIONS": str(partitions),
            **self.s3.env(),
        }
        self.log = open(root / "server.log", "wb")
        self.persister: subprocess.Popen[bytes] | None = None
        if split_persister:
            env["IM_RUN_PERSISTER"] = "false"
            self.persister = subprocess.Popen(
                [sys.executable, "-m", "im_server", "persister"],
                env={**env, "IM_RUN_PERSISTER": "true", "IM_NODE_NAME": "bench-persister"},
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )
        self.servers: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        for i in range(gateways):
            port = free_port()
            self.servers.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "im_server", "serve", "--port", str(port)),
                        *("--workers", str(workers)),
                    ],
                    env={**env, "IM_NODE_NAME": f"bench-{i + 1}"},
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                )
            )
            self.urls.append(f"http://127.0.0.1:{port}")
            wait_http(self.urls[-1])
        self.url = self.urls[0]
        self.recv_url = self.urls[-1]
        self.echo_port = free_port()
        self.echo = subprocess.Popen(
            [sys.executable, "-m", "im_server.bench.echo", str(self.echo_port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.echo_port)

    @property
    def dsn(self) -> str:
        """The stores' PostgreSQL for plain asyncpg (no SQLAlchemy driver suffix)."""
        return self.pg.url.replace("postgresql+asyncpg://", "postgresql://")

    def _redis_pids(self) -> list[int]:
        if self.cluster is not None:
            return [n.pid() or 0 for n in self.cluster.nodes]
        return [self.redis.pid() or 0] if self.redis is not None else []

    def _persister_pids(self) -> list[int]:
        return [self.persister.pid] if self.persister is not None else []

    def im_procs(self) -> Procs:
        """Server processes: a serve's workers are counted with it."""
        return Procs(
            pids=self._redis_pids() + self._persister_pids(),
            tree_roots=[self.pg.pid() or 0] + [s.pid for s in self.servers],
        )

    def parts(self) -> dict[str, Procs]:
        """The parts of the server side whose CPU is told apart (the persister only when it
        runs on its own)."""
        out = {
            "gateway": Procs(tree_roots=[s.pid for s in self.servers]),
            "redis": Procs(pids=self._redis_pids()),
            "postgres": Procs(tree_roots=[self.pg.pid() or 0]),
        }
        if self.persister is not None:
            out["persister"] = Procs(pids=self._persister_pids())
        return out

    def echo_procs(self) -> Procs:
        return Procs(pids=[self.echo.pid])

    def stop(self) -> None:
        for p in (*self.servers, *([self.persister] if self.persister else []), self.echo):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.s3.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self.redis is not None:
            self.redis.stop()
        self.pg.stop()
        self.log.close()


async def register_many(url: str, n: int, tag: str) -> list[Any]:
    from im_server.client import Client

    sem = asyncio.Semaphore(16)

    async def one(i: int) -> Any:
        async with sem:
            return await Client.register(url, f"{tag}{i}", "bench-password")

    return list(await asyncio.gather(*(one(i) for i in range(n))))
