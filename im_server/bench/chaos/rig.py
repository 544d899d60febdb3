"""The rig of one scenario: stores, gateways and (for the persister scenarios) a
persister process; how each component is killed and restarted; and a monitor of the
stream depth and of how much of the acked messages PostgreSQL holds."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis

from im_server.bench.chaos.params import GROUP, STREAM, Params
from im_server.bench.chaos.processes import PersisterProcess, tail_log
from im_server.bench.cluster import ServerProcess, Stores, pg_dsn
from im_server.runtime.embedded import start_postgres, start_redis


class Monitor:
    """Polls the stream depth and how much of a set of messages PostgreSQL holds."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.samples: list[tuple[float, int | None, int | None, int | None]] = []
        self.watch: list[tuple[int, str]] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None
        self._pg: asyncpg.Connection | None = None

    async def stream_state(self) -> tuple[int | None, int | None]:
        r = self.rig.redis_client()
        try:
            xlen = int(await asyncio.wait_for(r.xlen(STREAM), 2))
            try:
                pend = await asyncio.wait_for(r.xpending(STREAM, GROUP), 2)
                pending = int(pend["pending"]) if pend else 0
            except aioredis.ResponseError:
                pending = 0  # no group (an empty Redis)
            return xlen, pending
        except Exception:  # noqa: BLE001 - Redis down
            return None, None
        finally:
            with contextlib.suppress(Exception):
                await r.aclose()

    async def count_in_pg(self, keys: list[tuple[int, str]]) -> int | None:
        if not keys:
            return 0
        try:
            if self._pg is None or self._pg.is_closed():
                self._pg = await asyncpg.connect(self.rig.dsn, timeout=2)
            return int(
                await self._pg.fetchval(
                    # by the dedupe key, then the message it claimed (by its conv_id)
                    "SELECT count(*) FROM message_dedupe d JOIN unnest($1::bigint[], $2::text[])"
                    " AS k(s, c) ON d.sender_id = k.s AND d.client_msg_id = k.c"
                    " JOIN messages m ON m.conv_id = d.conv_id AND m.seq = d.seq",
                    [k[0] for k in keys],
                    [k[1] for k in keys],
                    timeout=2,
                )
            )
        except Exception:  # noqa: BLE001 - PostgreSQL down
            if self._pg is not None:
                with contextlib.suppress(Exception):
                    self._pg.terminate()
            self._pg = None
            return None

    async def _run(self) -> None:
        while not self._stop:
            t = time.monotonic()
            xlen, pending = await self.stream_state()
            cnt = await self.count_in_pg(self.watch) if self.watch else None
            self.samples.append((t, xlen, pending, cnt))
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="chaos-monitor")

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pg is not None:
            with contextlib.suppress(Exception):
                await self._pg.close()


class Rig:
    """Stores, gateways and (for the persister scenarios) a persister process."""

    def __init__(self, root: Path, scenario: str, p: Params) -> None:
        self.root = root
        self.scenario = scenario
        self.p = p
        self.log_dir = root / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stores: Stores | None = None
        self.gateways: list[ServerProcess] = []
        self.dead: list[ServerProcess] = []  # killed gateways, for their logs
        self.persisters: list[PersisterProcess] = []
        self.pending_at_kill: int | None = None

    @property
    def dsn(self) -> str:
        assert self.stores is not None
        return pg_dsn(self.stores)

    def redis_client(self) -> aioredis.Redis:
        assert self.stores is not None
        return aioredis.Redis.from_url(
            self.stores.redis.url,
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=1,
        )

    def env(self, node: str) -> dict[str, str]:
        assert self.stores is not None
        return {
            **self.stores.env(),
            "IM_NODE_NAME": node,
            "IM_TEST_LOG_DIR": str(self.log_dir),
            "IM_RATE_SEND_PER_S": "0",
            "IM_RATE_READ_PER_S": "0",
            "IM_PERSISTER_CLAIM_IDLE_MS": str(self.p.claim_idle_ms),
        }

    def start(self) -> None:
        self.stores = Stores.start(self.root / "stores", fsync=True)
        sc = self.scenario
        if sc == "gateway":
            specs = [("gw-a", ["--no-persister"]), ("gw-b", [])]
        elif sc.startswith("persister"):
            specs = [("gw-a", ["--no-persister"])]
        else:
            specs = [("gw-a", [])]
        self.gateways = [ServerProcess(env=self.env(n), extra_args=a) for n, a in specs]
        starters: list[Callable[[], object]] = [g.start for g in self.gateways]
        if sc.startswith("persister"):
            self.persisters.append(PersisterProcess(self.env("p1"), "p1", self.log_dir))
            starters.append(self.persisters[0].start)
        with ThreadPoolExecutor(len(starters)) as pool:
            for f in [pool.submit(fn) for fn in starters]:
                f.result()

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    # -- the crash -------------------------------------------------------------------
    async def _kill_persister_mid_batch(self) -> str:
        """Catch the persister inside a batch: the test holds ``LOCK TABLE messages IN
        SHARE MODE`` (only the persister inserts there; sends, reads and history go on),
        waits until the persister's INSERT waits on it (its entries read from the stream
        and pending, its transaction open), kills it, then lets the lock go: the dead
        consumer's transaction rolls back and its entries stay pending."""
        pp = self.persisters[-1]
        pid = pp.proc.pid if pp.proc else None
        conn = await asyncpg.connect(self.dsn)
        caught = False
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.execute("LOCK TABLE messages IN SHARE MODE")
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                waiting = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE relation = 'messages'::regclass"
                    " AND NOT granted"
                )
                if waiting:
                    caught = True
                    break
                await asyncio.sleep(0.01)
            self.pending_at_kill = (await Monitor(self).stream_state())[1]
            pp.kill9()
            await tx.rollback()
        finally:
            await conn.close()
        how = (
            f"its INSERT of {self.pending_at_kill} pending entries blocked (uncommitted)"
            if caught
            else "NOT caught inside a batch (no INSERT waited within 3 s)"
        )
        return f"persister process {pp.node} (pid {pid}, consumer persister-{pp.node}), {how}"

    async def kill(self) -> str:
        """kill -9 the scenario's component; returns what was killed."""
        assert self.stores is not None
        sc = self.scenario
        if sc == "gateway":
            g = self.gateways[0]
            pid = g.proc.pid if g.proc else None
            g.kill9()
            self.dead.append(g)
            return f"gateway gw-a (pid {pid}, port {g.port}, process group SIGKILL)"
        if sc.startswith("persister"):
            return await self._kill_persister_mid_batch()
        if sc in ("redis", "redis-empty"):
            pid = self.stores.redis.pid()
            self.stores.redis.kill()
            what = f"valkey-server (pid {pid}, port {self.stores.redis.port})"
            if sc == "redis-empty":
                d = self.stores.root / "redis"
                removed = []
                for name in ("appendonly.aof", "appendonlydir", "dump.rdb"):
                    f = d / name
                    if f.is_dir():
                        shutil.rmtree(f)
                        removed.append(name)
                    elif f.exists():
                        f.unlink()
                        removed.append(name)
                what += f", then deleted {', '.join(removed) or 'nothing'}"
            return what
        if sc == "postgres":
            pid = self.stores.pg.pid()
            self.stores.pg.kill()
            return f"postgres postmaster (pid {pid}, port {self.stores.pg.port})"
        raise ValueError(sc)

    def restart(self) -> None:
        assert self.stores is not None
        sc = self.scenario
        if sc == "gateway":
            old = self.gateways[0]
            g = ServerProcess(env=old.env, port=old.port, extra_args=old.extra_args)
            g.start()
            self.gateways[0] = g
        elif sc == "persister":
            self.persisters.append(PersisterProcess(self.env("p1"), "p1", self.log_dir).start())
        elif sc == "persister-rename":
            self.persisters.append(PersisterProcess(self.env("p2"), "p2", self.log_dir).start())
        elif sc in ("redis", "redis-empty"):
            self.stores.redis = start_redis(self.stores.root / "redis", self.stores.redis.port)
        elif sc == "postgres":
            self.stores.pg = start_postgres(
                self.stores.root / "pg", self.stores.pg.port, fsync=True
            )

    async def stream_diag(self) -> str:
        """XLEN, the consumer group, its consumers, pending entries, persister leases."""
        r = self.redis_client()
        out: list[str] = []
        try:
            for what, coro in (
                ("XLEN", r.xlen(STREAM)),
                ("XINFO GROUPS", r.xinfo_groups(STREAM)),
                ("XINFO CONSUMERS", r.xinfo_consumers(STREAM, GROUP)),
                ("XPENDING", r.xpending(STREAM, GROUP)),
                ("first entry", r.xrange(STREAM, count=1)),
            ):
                try:
                    out.append(f"{what}: {await asyncio.wait_for(coro, 2)}")
                except Exception as e:  # noqa: BLE001
                    out.append(f"{what}: {e!r}")
            try:
                lease_keys = [k async for k in r.scan_iter(match="*lease*", count=1000)]
                for k in lease_keys:
                    out.append(f"{k} = {await r.get(k)!r} (pttl {await r.pttl(k)} ms)")
            except Exception as e:  # noqa: BLE001
                out.append(f"lease keys: {e!r}")
        finally:
            with contextlib.suppress(Exception):
                await r.aclose()
        return "\n".join(out)

    def unexpected_exits(self) -> list[str]:
        """Processes that were not killed by the test but are gone (invariant 9)."""
        out = []
        for g in self.gateways:
            if g.proc is None or g.proc.poll() is not None:
                rc = g.proc.returncode if g.proc else None
                out.append(f"gateway {g.env.get('IM_NODE_NAME')} :{g.port} exited ({rc})")
        if self.persisters:
            pp = self.persisters[-1]
            if pp.proc is None or pp.proc.poll() is not None:
                rc = pp.proc.returncode if pp.proc else None
                out.append(f"persister {pp.node} exited ({rc})")
        return out

    def logs(self, n: int = 40) -> dict[str, str]:
        out: dict[str, str] = {}
        for g in self.dead:
            out[f"gateway {g.env.get('IM_NODE_NAME')} :{g.port} (killed)"] = tail_log(g.log_path, n)
        for g in self.gateways:
            out[f"gateway {g.env.get('IM_NODE_NAME')} :{g.port}"] = tail_log(g.log_path, n)
        for pp in self.persisters:
            out[f"persister {pp.node} (pid {pp.proc.pid if pp.proc else '?'})"] = pp.log_tail(n)
        if self.stores is not None and self.scenario in ("redis", "redis-empty"):
            out["redis.log"] = tail_log(self.stores.root / "redis" / "redis.log", 15)
        if self.stores is not None and self.scenario == "postgres":
            out["postgres.log"] = tail_log(self.stores.pg.log_file, 15)
        return out

    def stop(self) -> None:
        for pp in self.persisters:
            pp.terminate()
        for g in self.gateways:
            g.terminate()
        for g in self.dead:
            g.kill9()
        if self.stores is not None:
            self.stores.stop()
