"""The clients of a chaos run: one sender and one reader task per user, and every answer
noted (acks, refusals, confirmed read cursors) for the checks that follow."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from im_server.bench.chaos.params import Params
from im_server.client import ApiError, Client, Connection, ConnectionLost, JsonObject, conv_path


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
        self.retries = 0
        self.stopping = False
        self.hard_stop = False
        self.t_kill = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._conns: dict[int, Connection | None] = {}
        self.url_idx: dict[int, int] = {}

    # -- bookkeeping -----------------------------------------------------------------
    def note_error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def _on_ack(self, frame: JsonObject) -> str:
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
            self.note_error(f"ack:{code}")
            return "retry"
        s.refused = f"{code}: {frame.get('message')}"
        self.note_error(f"ack:{code}")
        return "refused"

    def _on_event(self, i: int, frame: JsonObject) -> None:
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
            idx = self.url_idx.get(i, 0)
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
                self.note_error(f"connect:{type(e).__name__}")
                self.url_idx[i] = idx + 1  # the next gateway
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
        return None

    def _drop(self, i: int) -> None:
        conn = self._conns.pop(i, None)
        if conn is not None:
            t = asyncio.ensure_future(conn.close())
            t.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)

    # -- tasks -----------------------------------------------------------------------
    async def _sender(self, i: int) -> None:
        p = self.p
        uid = int(self.users[i].user_id or 0)
        convs = self.convs[i]
        retry: deque[tuple[float, str]] = deque()  # (not before, client_msg_id)
        inflight: dict[asyncio.Future[JsonObject], tuple[str, float]] = {}
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
                    self.note_error(f"send:{type(exc).__name__}")
                    retry.append((0.0, cmid))
                    continue
                verdict = self._on_ack(fut.result())
                if verdict == "retry":
                    retry.append((now + 0.05, cmid))
            for fut, (cmid, t) in list(inflight.items()):
                if now - t > p.ack_timeout:
                    self.note_error("send:ack_timeout")
                    fut.cancel()
                    del inflight[fut]
                    retry.append((0.0, cmid))
        for fut in inflight:
            fut.cancel()
        for _ in retry:
            self.note_error("send:abandoned")
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
                    "POST", conv_path(conv) + "/read", json={"seq": seq}, timeout=3.0
                )
                self.confirmed.append((time.monotonic(), uid, conv, int(r["read_seq"])))
            except Exception as e:  # noqa: BLE001 - a store or the gateway is down
                self.note_error(f"read:{getattr(e, 'code', type(e).__name__)}")

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
