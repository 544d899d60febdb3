"""Crash under load: kill -9 one component while clients send and read, restart it, and
check what the stores hold afterwards (DESIGN.md invariants 1-4 and 9).

    /tmp/venv0/bin/python -m benchmarks.chaos [--scenarios gateway,redis] [--pre 15]
                                               [--post 5] [--window 16] [--json]

Each scenario starts its own PostgreSQL (fsync on) and Redis (AOF, appendfsync everysec)
in a temp folder, real ``im-server`` processes on them, and four users: two single chats
(A-B, C-D) and one group (A, B, C, D). Every user sends continuously over its WebSocket
with a window of sends in flight, alternating between its single chat and the group; a
send answered ``unavailable`` (or lost with its socket, or unanswered for a while) is
retried with the SAME client_msg_id, on a new socket (the next gateway) if the old one
died. Every user also reports reads (REST and WS, random seqs up to the highest acked
seq of the conversation); the read_seq the server answers, and the ``read`` frames it
pushes, are the confirmed cursors.

Scenarios (``load -> kill -9 -> restart -> load -> stop -> settle -> verify``):

* ``gateway``: two gateways on the same stores, the persister in the second one; the
  first (users A and B connect there) is killed, its clients move to the other one.
* ``persister``: gateways with ``--no-persister`` and ``python -m im_server persister``
  as its own process; killed mid-batch, restarted under the same IM_NODE_NAME (it
  re-reads its own pending entries).
* ``persister-rename``: the same, restarted under another name (XAUTOCLAIM of the dead
  consumer's entries once idle for IM_PERSISTER_CLAIM_IDLE_MS).
* ``redis``: Redis killed, restarted on its AOF (same port, same folder).
* ``postgres``: the postmaster killed, restarted on the same port (crash recovery).
* ``redis-empty``: Redis killed and its AOF deleted, so an EMPTY Redis comes back. The
  acked messages that were still only in the stream are gone with it (no AOF, nothing
  can keep them): they are counted as ``wiped``, not as lost, provided they are the tail
  of each conversation's stream (a hole below a persisted seq would be a real loss).

Verified each time: every ok-acked (conv_id, seq, client_msg_id) is in PostgreSQL exactly
once (``lost``); no (sender, client_msg_id) twice, no (conv_id, seq) twice, no
client_msg_id acked with two seqs and no seq acked for two client_msg_ids
(``duplicated``); per conversation, every seq acked for a send first made after the
restart is above every seq acked before the kill (``seq_violations``); every read cursor
in ``conv_members`` is at least the highest one the server confirmed (``read_regressions``);
resends of old client_msg_ids answer ``duplicate`` with their first seq (``resend_bad``);
the history of each conversation (REST) equals PostgreSQL.

Figures: messages acked under load at the kill (and the stream depth then); the
component's restart time (kill -> back); kill -> first ok ack received after the restart;
kill -> every sender has an ok ack for a send made after the kill (``resume``); the
longest stretch without any ok ack; kill -> everything acked before the kill is in
PostgreSQL (the stream drained of the pre-kill backlog); load stop -> stream empty.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import redis.asyncio as aioredis

from im_server.client import ApiError, Client, Connection, ConnectionLost
from im_server.runtime.embedded import start_postgres, start_redis
from tests.support import FAST_HASH_ENV, ServerProcess, Stores, befriend, new_user

SCENARIOS = ("gateway", "persister", "persister-rename", "redis", "postgres", "redis-empty")
STREAM = "im:stream:{p0}"
GROUP = "persist"


@dataclass
class Params:
    pre_s: float = 4.0  # load before the kill
    down_s: float = 0.5  # a store stays dead this long before it is restarted
    post_s: float = 3.0  # load after the first ok ack that follows the restart
    window: int = 8  # sends in flight per sender
    rate: float = 0.0  # new sends per second per sender; 0 = as fast as acks come back
    read_interval: float = 0.05  # per user, between two read reports
    ack_timeout: float = 5.0  # an unanswered send is retried (same client_msg_id) after this
    recover_timeout: float = 60.0  # no ok ack this long after the restart = not recovered
    finish_timeout: float = 30.0  # after the load stops, retries must be answered by then
    settle_timeout: float = 60.0  # stream drained and history complete by then
    claim_idle_ms: int = 2000
    resend_sample: int = 20


# --------------------------------------------------------------------------- helpers


def pg_dsn(stores: Stores) -> str:
    return stores.pg.url.replace("postgresql+asyncpg", "postgresql")


_TS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_NOISE = ("uvicorn.error: connection open", '"WebSocket /v1/ws?token=', "connection closed")


def _tail_file(path: Path | None, n: int = 40) -> str:
    """The last ``n`` lines, with runs of the same message (timestamps aside) collapsed
    and WebSocket open/close chatter left out, so that a storm of one warning does not
    hide what came before it."""
    if path is None or not path.exists():
        return ""
    out: list[str] = []
    last_key, repeats = None, 0
    for line in path.read_text(errors="replace").splitlines():
        if any(x in line for x in _NOISE):
            continue
        key = _TS.sub("", line)
        if key == last_key:
            repeats += 1
            continue
        if repeats:
            out.append(f"    ... the same {repeats} more time(s)")
        out.append(line)
        last_key, repeats = key, 0
    if repeats:
        out.append(f"    ... the same {repeats} more time(s)")
    return "\n".join(out[-n:])


class PersisterProcess:
    """``python -m im_server persister`` in its own session (kill -9 = a real crash)."""

    def __init__(self, env: dict[str, str], node: str, log_dir: Path) -> None:
        self.env = {**os.environ, **FAST_HASH_ENV, **env, "IM_NODE_NAME": node}
        self.node = node
        self.log_path = log_dir / f"persister-{node}-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> PersisterProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "im_server", "persister"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while "running as consumer" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"persister exited {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"persister not running after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.02)
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self, n: int = 60) -> str:
        return _tail_file(self.log_path, n)


# --------------------------------------------------------------------------- the load


@dataclass
class Ack:
    conv_id: str
    seq: int
    duplicate: bool
    t: float


@dataclass
class Sent:
    sender: int
    conv_id: str
    t_first: float
    attempts: int = 0
    acks: list[Ack] = field(default_factory=list)
    refused: str | None = None


class Load:
    """The clients: one sender and one reader task per user, and every answer noted."""

    def __init__(
        self, users: list[Client], convs: dict[int, list[str]], urls: list[str], p: Params
    ) -> None:
        self.users = users
        self.convs = convs  # user index -> its conversations
        self.urls = urls  # gateways, in order of preference
        self.p = p
        self.sent: dict[str, Sent] = {}  # client_msg_id -> what happened to it
        self.max_acked: dict[str, int] = {}
        self.confirmed: list[tuple[float, int, str, int]] = []  # (t, user, conv, read_seq)
        self.ack_times: list[float] = []
        self.errors: dict[str, int] = {}
        self.reconnects = 0
        self.retries = 0
        self.stopping = False
        self.hard_stop = False
        self.t_kill = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._conns: dict[int, Connection | None] = {}
        self._url_idx: dict[int, int] = {}

    # -- bookkeeping -----------------------------------------------------------------
    def _note_error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def _on_ack(self, frame: dict[str, Any]) -> str:
        """Record an ack frame; returns 'ok', 'retry' or 'refused'."""
        cmid = str(frame.get("client_msg_id"))
        s = self.sent.get(cmid)
        if s is None:
            return "refused"
        if frame.get("ok"):
            now = time.monotonic()
            conv, seq = str(frame["conv_id"]), int(frame["seq"])
            s.acks.append(Ack(conv, seq, bool(frame.get("duplicate")), now))
            self.ack_times.append(now)
            if seq > self.max_acked.get(conv, 0):
                self.max_acked[conv] = seq
            return "ok"
        code = str(frame.get("code"))
        if code in ("unavailable", "rate_limited"):
            self._note_error(f"ack:{code}")
            return "retry"
        s.refused = f"{code}: {frame.get('message')}"
        self._note_error(f"ack:{code}")
        return "refused"

    def _on_event(self, i: int, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "read":
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.confirmed.append(
                    (
                        time.monotonic(),
                        int(frame["user_id"]),
                        str(frame["conv_id"]),
                        int(frame["seq"]),
                    )
                )
        elif kind == "ack" and frame.get("ok"):
            # the ack of a send we stopped waiting for (timed out): still an ack
            s = self.sent.get(str(frame.get("client_msg_id")))
            if s is not None:
                self._on_ack(frame)

    # -- connections -----------------------------------------------------------------
    async def _connect(self, i: int) -> Connection | None:
        backoff = 0.05
        while not self.hard_stop:
            idx = self._url_idx.get(i, 0)
            url = self.urls[idx % len(self.urls)]
            client = self.users[i]
            client.base_url = url
            try:
                conn = await client.connect(
                    on_event=functools.partial(self._on_event, i),
                    queue_events=False,
                    open_timeout=3,
                )
                if conn.closed.is_set():
                    raise ConnectionLost(conn.close_code, conn.close_reason)
                self._conns[i] = conn
                return conn
            except (OSError, ApiError, ConnectionLost, TimeoutError, Exception) as e:  # noqa: BLE001
                self._note_error(f"connect:{type(e).__name__}")
                self._url_idx[i] = idx + 1  # the next gateway
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
        return None

    def _drop(self, i: int) -> None:
        conn = self._conns.pop(i, None)
        if conn is not None:
            self.reconnects += 1
            t = asyncio.ensure_future(conn.close())
            t.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)

    # -- tasks -----------------------------------------------------------------------
    async def _sender(self, i: int) -> None:
        p = self.p
        uid = int(self.users[i].user_id or 0)
        convs = self.convs[i]
        retry: deque[tuple[float, str]] = deque()  # (not before, client_msg_id)
        inflight: dict[asyncio.Future[dict[str, Any]], tuple[str, float]] = {}
        n = 0
        next_new = time.monotonic()
        conn: Connection | None = None
        while not self.hard_stop:
            if self.stopping and not retry and not inflight:
                break
            if conn is None or conn.closed.is_set():
                if conn is not None:
                    self._drop(i)
                    for fut, (lost_cmid, _) in inflight.items():
                        fut.cancel()
                        retry.append((0.0, lost_cmid))
                    inflight.clear()
                conn = await self._connect(i)
                if conn is None:
                    break
            now = time.monotonic()
            # fill the window: due retries first, then new sends
            while len(inflight) < p.window:
                cmid: str | None = None
                if retry and retry[0][0] <= now:
                    cmid = retry.popleft()[1]
                    self.retries += 1
                elif not self.stopping and (p.rate <= 0 or now >= next_new):
                    cmid = f"c{i}-{n}-{uuid.uuid4().hex[:12]}"
                    conv = convs[n % len(convs)]
                    n += 1
                    self.sent[cmid] = Sent(uid, conv, now)
                    if p.rate > 0:
                        next_new = max(next_new + 1.0 / p.rate, now - 1.0)
                if cmid is None:
                    break
                s = self.sent[cmid]
                s.attempts += 1
                try:
                    fut = await conn.send_nowait(s.conv_id, f"{uid} #{n}", client_msg_id=cmid)
                except Exception:  # noqa: BLE001 - the socket died under us
                    retry.appendleft((0.0, cmid))
                    break
                inflight[fut] = (cmid, time.monotonic())
            if conn.closed.is_set():
                continue
            wait_for = 0.2
            if retry:
                wait_for = min(wait_for, max(0.001, retry[0][0] - time.monotonic()))
            if p.rate > 0 and not self.stopping:
                wait_for = min(wait_for, max(0.001, next_new - time.monotonic()))
            if not inflight:
                await asyncio.sleep(wait_for)
                continue
            done, _ = await asyncio.wait(
                list(inflight), timeout=wait_for, return_when=asyncio.FIRST_COMPLETED
            )
            now = time.monotonic()
            for fut in done:
                cmid, _t = inflight.pop(fut)
                if fut.cancelled():
                    continue
                exc = fut.exception()
                if exc is not None:
                    self._note_error(f"send:{type(exc).__name__}")
                    retry.append((0.0, cmid))
                    continue
                verdict = self._on_ack(fut.result())
                if verdict == "retry":
                    retry.append((now + 0.05, cmid))
            for fut, (cmid, t) in list(inflight.items()):
                if now - t > p.ack_timeout:
                    self._note_error("send:ack_timeout")
                    fut.cancel()
                    del inflight[fut]
                    retry.append((0.0, cmid))
        for fut in inflight:
            fut.cancel()
        for _ in retry:
            self._note_error("send:abandoned")
        self._drop(i)

    async def _reader(self, i: int) -> None:
        client = self.users[i]
        uid = int(client.user_id or 0)
        rnd = random.Random(i)
        k = 0
        while not self.stopping and not self.hard_stop:
            await asyncio.sleep(self.p.read_interval)
            conv = rnd.choice(self.convs[i])
            hi = self.max_acked.get(conv, 0)
            if hi < 1:
                continue
            seq = rnd.randint(max(1, hi - 50), hi)
            k += 1
            conn = self._conns.get(i)
            if k % 2 and conn is not None and not conn.closed.is_set():
                with contextlib.suppress(Exception):
                    await conn.read(conv, seq)  # confirmed by the pushes it causes
                continue
            try:
                r = await client.request(
                    "POST", Client._c(conv) + "/read", json={"seq": seq}, timeout=3.0
                )
                self.confirmed.append((time.monotonic(), uid, conv, int(r["read_seq"])))
            except Exception as e:  # noqa: BLE001 - a store or the gateway is down
                self._note_error(f"read:{getattr(e, 'code', type(e).__name__)}")

    def start(self) -> None:
        for i in range(len(self.users)):
            self._tasks.append(asyncio.create_task(self._sender(i), name=f"chaos-sender-{i}"))
            self._tasks.append(asyncio.create_task(self._reader(i), name=f"chaos-reader-{i}"))

    async def stop(self, timeout: float) -> bool:
        """Stop making new sends; wait until every outstanding one is answered."""
        self.stopping = True
        done, pending = await asyncio.wait(self._tasks, timeout=timeout)
        if pending:
            self.hard_stop = True
            await asyncio.wait(pending, timeout=5)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        for i in list(self._conns):
            conn = self._conns.pop(i)
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        return not pending

    # -- views -----------------------------------------------------------------------
    def ok_acked(self, before: float | None = None) -> dict[str, Sent]:
        return {
            c: s
            for c, s in self.sent.items()
            if s.acks and (before is None or s.acks[0].t < before)
        }


# --------------------------------------------------------------------------- the rig


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
                    "SELECT count(*) FROM messages m JOIN unnest($1::bigint[], $2::text[])"
                    " AS k(s, c) ON m.sender_id = k.s AND m.client_msg_id = k.c",
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
        starters: list[Any] = [g.start for g in self.gateways]
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
            what = f"redis-server (pid {pid}, port {self.stores.redis.port})"
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
            out[f"gateway {g.env.get('IM_NODE_NAME')} :{g.port} (killed)"] = _tail_file(
                g.log_path, n
            )
        for g in self.gateways:
            out[f"gateway {g.env.get('IM_NODE_NAME')} :{g.port}"] = _tail_file(g.log_path, n)
        for pp in self.persisters:
            out[f"persister {pp.node} (pid {pp.proc.pid if pp.proc else '?'})"] = pp.log_tail(n)
        if self.stores is not None and self.scenario in ("redis", "redis-empty"):
            out["redis.log"] = _tail_file(self.stores.root / "redis" / "redis.log", 15)
        if self.stores is not None and self.scenario == "postgres":
            out["postgres.log"] = _tail_file(self.stores.pg.log_file, 15)
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


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    scenario: str
    killed: str = ""
    t_kill_s: float = 0.0  # seconds of load before the kill
    acked_at_kill: int = 0  # distinct messages ok-acked before the kill
    stream_at_kill: int | None = None  # XLEN just before the kill
    pending_at_kill: int | None = None  # entries read by the persister, not yet acked
    acked_total: int = 0
    sends: int = 0
    attempts: int = 0
    duplicate_acks: int = 0  # ok acks with duplicate: true (retries of queued sends)
    refused: int = 0
    unanswered: int = 0  # sends never answered ok by the end (given up)
    read_reports_confirmed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    seq_violations: list[str] = field(default_factory=list)
    read_regressions: list[str] = field(default_factory=list)
    resend_bad: list[str] = field(default_factory=list)
    history_bad: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # processes the test did not kill, gone
    wiped: int = 0  # redis-empty: acked, still only in the stream when the data was deleted
    restart_s: float = 0.0  # kill -> component back (restart call returned)
    first_ack_s: float | None = None  # kill -> first ok ack received after the restart
    resume_s: float | None = (
        None  # kill -> every sender has an ok ack for a send made after the kill
    )
    max_ack_gap_s: float = 0.0  # longest stretch without any ok ack around the kill
    backlog_persisted_s: float | None = None  # kill -> all pre-kill acks in PostgreSQL
    drain_s: float | None = None  # load stop -> stream empty, every ack in PostgreSQL
    recovered: bool = False
    settled: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    stream_diag: str = ""  # when the stream did not drain: what Redis says about it
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.recovered
            and self.settled
            and not (
                self.lost
                or self.duplicated
                or self.seq_violations
                or self.read_regressions
                or self.resend_bad
                or self.history_bad
                or self.exited
            )
        )

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("logs")
        for k in (
            "lost",
            "duplicated",
            "seq_violations",
            "read_regressions",
            "resend_bad",
            "history_bad",
            "exited",
        ):
            d[f"{k}_n"] = len(d[k])
            d[k] = d[k][:20]
        d["ok"] = self.ok
        return d

    def report(self, with_logs: bool = True) -> str:
        lines = [
            f"scenario {self.scenario}: killed {self.killed} after {self.t_kill_s:.2f} s of load "
            f"({self.acked_at_kill} acked; stream {self.stream_at_kill}, pending {self.pending_at_kill})",
            f"  acked {self.acked_total} of {self.sends} sends ({self.attempts} attempts, "
            f"{self.duplicate_acks} duplicate acks, {self.refused} refused, {self.unanswered} unanswered); "
            f"{self.read_reports_confirmed} read cursors confirmed; "
            f"errors {self.errors}",
            f"  restart {self.restart_s:.2f} s, first ack {self.first_ack_s}, resume {self.resume_s}, max gap "
            f"{self.max_ack_gap_s:.2f} s, backlog persisted {self.backlog_persisted_s}, drain {self.drain_s}",
            f"  recovered={self.recovered} settled={self.settled} wiped={self.wiped}",
        ]
        for k in (
            "lost",
            "duplicated",
            "seq_violations",
            "read_regressions",
            "resend_bad",
            "history_bad",
            "exited",
        ):
            v = getattr(self, k)
            if v:
                lines.append(f"  {k} ({len(v)}): " + "; ".join(v[:15]))
        if self.stream_diag:
            lines.append(
                "  stream when the settle wait gave up:\n    "
                + self.stream_diag.replace("\n", "\n    ")
            )
        if with_logs and not self.ok:
            for name, text in self.logs.items():
                lines.append(f"--- {name} ---\n{text}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- one scenario


async def _setup_users(url: str) -> tuple[list[Client], dict[int, list[str]], list[str]]:
    users = [await new_user(url, f"ch{k}") for k in "abcd"]
    ab = await befriend(users[0], users[1])
    cd = await befriend(users[2], users[3])
    g = await users[0].create_group("chaos", [int(u.user_id or 0) for u in users[1:]])
    grp = str(g["conv_id"])
    convs = {0: [ab, grp], 1: [ab, grp], 2: [cd, grp], 3: [cd, grp]}
    return users, convs, [ab, cd, grp]


async def _all_history(client: Client, conv: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    begin = 1
    for _ in range(10_000):
        r = await client.history(conv, begin=begin, end=begin + 499, limit=500, order="asc")
        out.extend((int(m["seq"]), str(m["client_msg_id"])) for m in r["messages"])
        if r["is_end"] or begin + 499 >= int(r["max_seq"]):
            break
        begin += 500
    return out


async def run_scenario(scenario: str, root: Path, p: Params) -> Result:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
    res = Result(scenario)
    rig = Rig(root, scenario, p)
    load: Load | None = None
    mon: Monitor | None = None
    users: list[Client] = []
    try:
        await asyncio.to_thread(rig.start)
        users, convs, all_convs = await _setup_users(rig.urls[-1])
        # users A, B on the first gateway (the one a gateway scenario kills), C, D on the last
        urls = rig.urls
        load = Load(users, convs, urls, p)
        for i in range(len(users)):
            load._url_idx[i] = 0 if i < 2 else len(urls) - 1
        mon = Monitor(rig)
        mon.start()

        t0 = time.monotonic()
        load.start()
        await asyncio.sleep(p.pre_s)

        # ---- the crash
        xlen, pending = await mon.stream_state()
        res.stream_at_kill, res.pending_at_kill = xlen, pending
        res.killed = await rig.kill()
        t_kill = load.t_kill = time.monotonic()
        if rig.pending_at_kill is not None:
            res.pending_at_kill = rig.pending_at_kill
        res.t_kill_s = t_kill - t0
        prekill = load.ok_acked(before=t_kill)
        res.acked_at_kill = len(prekill)
        mon.watch = [(s.sender, c) for c, s in prekill.items()]
        if scenario != "gateway":
            await asyncio.sleep(p.down_s)
        await asyncio.to_thread(rig.restart)
        t_restart = time.monotonic()
        res.restart_s = t_restart - t_kill
        load.urls[:] = rig.urls  # same ports; a restarted gateway is a new process

        # ---- recovery: the first ok ack received after the restart, then more load
        deadline = t_restart + p.recover_timeout
        while time.monotonic() < deadline:
            after = [t for t in load.ack_times[-200:] if t >= t_restart]
            if after:
                res.first_ack_s = min(after) - t_kill
                res.recovered = True
                break
            await asyncio.sleep(0.02)
        if res.recovered:
            await asyncio.sleep(p.post_s)
        t_stop = time.monotonic()
        finished = await load.stop(p.finish_timeout)
        if not finished:
            load._note_error("load:finish_timeout")

        # ---- settle: stream empty, every ack in PostgreSQL (those that can be)
        acked = load.ok_acked()
        keys = [(s.sender, c) for c, s in acked.items()]
        deadline = time.monotonic() + p.settle_timeout
        while time.monotonic() < deadline:
            xlen, _pending = await mon.stream_state()
            cnt = await mon.count_in_pg(keys)
            if xlen == 0 and cnt is not None:
                if cnt == len(keys) or scenario == "redis-empty":
                    res.settled = True
                    res.drain_s = time.monotonic() - t_stop
                    break
            await asyncio.sleep(0.1)
        if not res.settled:
            res.stream_diag = await rig.stream_diag()
        await mon.stop()

        # ---- resends of old client_msg_ids: duplicate, first seq
        await _check_resends(rig, load, users, prekill, t_restart, res)

        # ---- verification against PostgreSQL
        await _verify(rig, load, all_convs, t_kill, t_restart, prekill, res, mon)
        # history (REST) equals PostgreSQL, one member per conversation
        await _check_history(rig, users, all_convs, res)
        res.errors = dict(sorted(load.errors.items()))
        res.exited = rig.unexpected_exits()
    finally:
        if load is not None and not load.stopping:
            load.hard_stop = True
            with contextlib.suppress(Exception):
                await load.stop(5)
        if mon is not None:
            await mon.stop()
        for u in users:
            with contextlib.suppress(Exception):
                await u.aclose()
        res.logs = rig.logs()
        await asyncio.to_thread(rig.stop)
    return res


async def _check_resends(
    rig: Rig,
    load: Load,
    users: list[Client],
    prekill: dict[str, Sent],
    t_restart: float,
    res: Result,
) -> None:
    rnd = random.Random(7)
    before = list(prekill.items())
    after = [(c, s) for c, s in load.ok_acked().items() if s.t_first >= t_restart]
    sample = rnd.sample(before, min(len(before), rig.p.resend_sample))
    sample += rnd.sample(after, min(len(after), rig.p.resend_sample // 2))
    by_uid = {int(u.user_id or 0): u for u in users}
    live = rig.urls
    conns: dict[int, Connection] = {}
    try:
        for cmid, s in sample:
            first = s.acks[0]
            if rig.scenario == "redis-empty" and cmid not in await _persisted(
                rig, [(s.sender, cmid)]
            ):
                continue  # wiped with the Redis data: nothing remembers it (counted apart)
            client = by_uid[s.sender]
            client.base_url = live[-1]
            ack: dict[str, Any] = {}
            try:
                conn = conns.get(s.sender)
                if conn is None:
                    conn = conns[s.sender] = await client.connect(queue_events=False)
                for _ in range(50):
                    ack = await conn.send(s.conv_id, "resend", client_msg_id=cmid, timeout=10)
                    if ack.get("ok") or ack.get("code") != "unavailable":
                        break
                    await asyncio.sleep(0.1)
            except Exception as e:  # noqa: BLE001
                conns.pop(s.sender, None)
                ack = {"error": repr(e)}
            if not (
                ack.get("ok")
                and ack.get("duplicate") is True
                and ack.get("conv_id") == first.conv_id
                and int(ack.get("seq", -1)) == first.seq
            ):
                res.resend_bad.append(
                    f"resend of {cmid} (sender {s.sender}, first acked {first.conv_id}/{first.seq}"
                    f" at t_kill{first.t - load.t_kill:+.3f}s) answered {ack}"
                )
    finally:
        for conn in conns.values():
            with contextlib.suppress(Exception):
                await conn.close()


async def _persisted(rig: Rig, keys: list[tuple[int, str]]) -> set[str]:
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            "SELECT m.client_msg_id FROM messages m JOIN unnest($1::bigint[], $2::text[])"
            " AS k(s, c) ON m.sender_id = k.s AND m.client_msg_id = k.c",
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
    finally:
        await conn.close()
    return {r["client_msg_id"] for r in rows}


async def _verify(
    rig: Rig,
    load: Load,
    all_convs: list[str],
    t_kill: float,
    t_restart: float,
    prekill: dict[str, Sent],
    res: Result,
    mon: Monitor,
) -> None:
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            "SELECT conv_id, seq, sender_id, client_msg_id FROM messages WHERE conv_id = ANY($1)",
            all_convs,
        )
        dup_keys = await conn.fetch(
            "SELECT sender_id, client_msg_id, count(*) AS n FROM messages WHERE conv_id = ANY($1)"
            " GROUP BY 1, 2 HAVING count(*) > 1",
            all_convs,
        )
        dup_seqs = await conn.fetch(
            "SELECT conv_id, seq, count(*) AS n FROM messages WHERE conv_id = ANY($1)"
            " GROUP BY 1, 2 HAVING count(*) > 1",
            all_convs,
        )
        cursors = await conn.fetch(
            "SELECT conv_id, user_id, read_seq FROM conv_members WHERE conv_id = ANY($1)",
            all_convs,
        )
    finally:
        await conn.close()

    acked = load.ok_acked()
    res.sends = len(load.sent)
    res.acked_total = len(acked)
    res.attempts = sum(s.attempts for s in load.sent.values())
    res.duplicate_acks = sum(1 for s in load.sent.values() for a in s.acks if a.duplicate)
    res.refused = sum(1 for s in load.sent.values() if s.refused)
    res.unanswered = sum(1 for s in load.sent.values() if not s.acks and not s.refused)

    for r in dup_keys:
        res.duplicated.append(
            f"PostgreSQL holds ({r['sender_id']}, {r['client_msg_id']}) {r['n']} times"
        )
    for r in dup_seqs:
        res.duplicated.append(f"PostgreSQL holds {r['conv_id']}/{r['seq']} {r['n']} times")
    by_key: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for r in rows:
        by_key.setdefault((int(r["sender_id"]), str(r["client_msg_id"])), []).append(
            (str(r["conv_id"]), int(r["seq"]))
        )

    # acks: one (conv, seq) per client_msg_id, one client_msg_id per (conv, seq)
    seq_owner: dict[tuple[str, int], str] = {}
    for cmid, s in acked.items():
        places = {(a.conv_id, a.seq) for a in s.acks}
        if len(places) > 1:
            res.duplicated.append(
                f"{cmid} (sender {s.sender}) acked with several seqs {sorted(places)}"
            )
        for place in places:
            other = seq_owner.setdefault(place, cmid)
            if other != cmid:
                res.duplicated.append(
                    f"{place[0]}/{place[1]} acked for two sends: {other} and {cmid} (seq reused)"
                )

    # lost: every ack's (conv, seq, client_msg_id) in PostgreSQL
    missing: list[tuple[str, Sent]] = []
    wiped: set[str] = set()
    for cmid, s in acked.items():
        a = s.acks[0]
        got = by_key.get((s.sender, cmid), [])
        if got == [(a.conv_id, a.seq)]:
            continue
        if not got:
            missing.append((cmid, s))
            continue
        res.lost.append(
            f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} "
            f"({'before' if a.t < t_kill else 'after'} the kill, t_kill{a.t - t_kill:+.3f}s) "
            f"but PostgreSQL holds it at {got}"
        )
    if rig.scenario == "redis-empty":
        # The stream's tail went with the Redis data: acks given by the old Redis (before
        # the restart) above the highest persisted seq of those acks in the conversation.
        # A missing one below it is a hole, and a real loss.
        top_old: dict[str, int] = {}
        for cmid, s in acked.items():
            a = s.acks[0]
            if a.t < t_restart and by_key.get((s.sender, cmid)):
                top_old[a.conv_id] = max(top_old.get(a.conv_id, 0), a.seq)
        for cmid, s in missing:
            a = s.acks[0]
            if a.t < t_restart and a.seq > top_old.get(a.conv_id, 0):
                res.wiped += 1
                wiped.add(cmid)
            else:
                res.lost.append(
                    f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} at t_kill{a.t - t_kill:+.3f}s"
                    f" is not in PostgreSQL (highest persisted seq acked by the old Redis there: "
                    f"{top_old.get(a.conv_id, 0)})"
                )
    else:
        for cmid, s in missing:
            a = s.acks[0]
            res.lost.append(
                f"{cmid} (sender {s.sender}) acked {a.conv_id}/{a.seq} "
                f"({'before' if a.t < t_kill else 'after'} the kill, t_kill{a.t - t_kill:+.3f}s, "
                f"{s.attempts} attempts) is not in PostgreSQL"
            )

    # seqs never reused, never back: sends first made after the restart are above every
    # seq acked before the kill
    before: dict[str, int] = {}
    for s in prekill.values():
        for a in s.acks:
            if a.t < t_kill:
                before[a.conv_id] = max(before.get(a.conv_id, 0), a.seq)
    for cmid, s in acked.items():
        if s.t_first < t_restart:
            continue
        for a in s.acks:
            if a.seq <= before.get(a.conv_id, 0):
                res.seq_violations.append(
                    f"{cmid} first sent t_kill+{s.t_first - t_kill:.2f}s got {a.conv_id}/{a.seq}"
                    f" <= {before[a.conv_id]} acked before the kill"
                )

    # read cursors: never below what the server confirmed (before the kill, and at all)
    pg_cursor = {(str(r["conv_id"]), int(r["user_id"])): int(r["read_seq"] or 0) for r in cursors}
    best_before: dict[tuple[str, int], int] = {}
    best: dict[tuple[str, int], int] = {}
    for t, uid, conv, v in load.confirmed:
        if conv not in all_convs:
            continue
        k = (conv, uid)
        best[k] = max(best.get(k, 0), v)
        if t < t_kill:
            best_before[k] = max(best_before.get(k, 0), v)
    res.read_reports_confirmed = len(load.confirmed)
    for k, v in sorted(best.items()):
        have = pg_cursor.get(k)
        if have is None or have < v:
            when = "before the kill" if best_before.get(k, 0) > (have or 0) else "after the restart"
            res.read_regressions.append(
                f"conv_members {k[0]} user {k[1]}: read_seq {have} < {v} confirmed "
                f"(max confirmed before the kill {best_before.get(k, 0)}; the lost one {when})"
            )

    # figures
    times = sorted(load.ack_times)
    window = [t for t in times if t >= t_kill - 1.0]
    gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
    if window:
        gaps.append(window[0] - (t_kill - 1.0))
    res.max_ack_gap_s = round(max(gaps, default=0.0), 3)
    need = sum(1 for _uid, c in mon.watch if c not in wiped)
    for t, _x, _pnd, cnt in mon.samples:
        if t >= t_kill and cnt is not None and cnt >= need:
            res.backlog_persisted_s = round(t - t_kill, 3)
            break
    firsts: dict[int, float] = {}
    for s in acked.values():
        if s.t_first >= t_kill:
            firsts[s.sender] = min(firsts.get(s.sender, s.acks[0].t), s.acks[0].t)
    senders = {s.sender for s in load.sent.values()}
    if senders and set(firsts) == senders:
        res.resume_s = round(max(firsts.values()) - t_kill, 3)
    if res.first_ack_s is not None:
        res.first_ack_s = round(res.first_ack_s, 3)
    if res.drain_s is not None:
        res.drain_s = round(res.drain_s, 3)
    res.restart_s = round(res.restart_s, 3)
    res.t_kill_s = round(res.t_kill_s, 3)


async def _check_history(rig: Rig, users: list[Client], all_convs: list[str], res: Result) -> None:
    conn = await asyncpg.connect(rig.dsn)
    try:
        rows = await conn.fetch(
            "SELECT conv_id, seq, client_msg_id FROM messages WHERE conv_id = ANY($1)", all_convs
        )
    finally:
        await conn.close()
    in_pg: dict[str, list[tuple[int, str]]] = {c: [] for c in all_convs}
    for r in rows:
        in_pg[str(r["conv_id"])].append((int(r["seq"]), str(r["client_msg_id"])))
    readers = {all_convs[0]: users[0], all_convs[1]: users[2], all_convs[2]: users[0]}
    for conv, client in readers.items():
        client.base_url = rig.urls[-1]
        try:
            got = await _all_history(client, conv)
        except Exception as e:  # noqa: BLE001
            res.history_bad.append(f"history of {conv} failed: {e!r}")
            continue
        want = sorted(in_pg[conv])
        if sorted(got) != want:
            extra = sorted(set(got) - set(want))[:5]
            gone = sorted(set(want) - set(got))[:5]
            res.history_bad.append(
                f"history of {conv}: {len(got)} messages, PostgreSQL {len(want)}"
                f" (only in history {extra}, only in PostgreSQL {gone})"
            )


# --------------------------------------------------------------------------- runner


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def print_table(results: list[Result]) -> None:
    cols = [
        ("scenario", lambda r: r.scenario),
        ("acked@kill", lambda r: r.acked_at_kill),
        ("stream@kill", lambda r: r.stream_at_kill),
        ("acked", lambda r: r.acked_total),
        ("lost", lambda r: len(r.lost)),
        ("dup", lambda r: len(r.duplicated)),
        ("seq!", lambda r: len(r.seq_violations)),
        ("read!", lambda r: len(r.read_regressions)),
        ("wiped", lambda r: r.wiped),
        ("restart s", lambda r: r.restart_s),
        ("1st ack s", lambda r: r.first_ack_s),
        ("resume s", lambda r: r.resume_s),
        ("max gap s", lambda r: r.max_ack_gap_s),
        ("backlog s", lambda r: r.backlog_persisted_s),
        ("drain s", lambda r: r.drain_s),
        ("ok", lambda r: "yes" if r.ok else "NO"),
    ]
    table = [[_fmt(f(r)) for _, f in cols] for r in results]
    widths = [max(len(h), *(len(row[k]) for row in table)) for k, (h, _) in enumerate(cols)]
    print("  ".join(h.rjust(w) for (h, _), w in zip(cols, widths, strict=True)))
    for row in table:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


async def amain(args: argparse.Namespace) -> int:
    p = Params(
        pre_s=args.pre,
        post_s=args.post,
        down_s=args.down,
        window=args.window,
        rate=args.rate,
        settle_timeout=args.settle_timeout,
    )
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    results: list[Result] = []
    base = Path(tempfile.mkdtemp(prefix="im-chaos-"))
    try:
        for name in names:
            if not args.json:
                print(
                    f"== {name}: {p.pre_s:.0f} s of load, kill -9, restart, {p.post_s:.0f} s more",
                    flush=True,
                )
            r = await run_scenario(name, base / name, p)
            results.append(r)
            if not args.json:
                print(r.report(with_logs=not r.ok), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(
            orjson.dumps(
                {"params": asdict(p), "scenarios": [r.summary() for r in results]}
            ).decode()
        )
    else:
        print()
        print_table(results)
        print(
            "\nacked@kill: distinct messages ok-acked before the kill; lost/dup/seq!/read!: "
            "invariant violations (must be 0); wiped: redis-empty, acked messages still only "
            "in the deleted stream; restart: kill -> component back; 1st ack: kill -> first "
            "ok ack after the restart; resume: kill -> every sender has an ok ack for a send made "
            "after the kill; max gap: longest stretch without any ok ack; backlog: "
            "kill -> every pre-kill ack in PostgreSQL; drain: load stop -> stream empty."
        )
    return 0 if all(r.ok for r in results) else 1


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--pre", type=float, default=15.0, help="seconds of load before the kill")
    ap.add_argument("--post", type=float, default=5.0, help="seconds of load after recovery")
    ap.add_argument("--down", type=float, default=1.0, help="seconds a store stays dead")
    ap.add_argument("--window", type=int, default=16, help="sends in flight per sender")
    ap.add_argument("--rate", type=float, default=0.0, help="new sends/s per sender (0: no cap)")
    ap.add_argument("--settle-timeout", type=float, default=120.0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs, data)")
    args = ap.parse_args()
    try:
        import uvloop

        rc = uvloop.run(amain(args))
    except ImportError:
        rc = asyncio.run(amain(args))
    sys.exit(rc)


if __name__ == "__main__":
    main()
