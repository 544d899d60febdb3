"""Live connections of this process. Each has a bounded send queue drained by its own
writer task: a broadcast never awaits a client, and a client that cannot keep up is
dropped instead of stalling everyone."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from im_server import metrics
from im_server.gateway.corked import ROUND, direct_protocol, still_open, writable
from im_server.protocol.close_codes import CloseCode

log = logging.getLogger("im_server.hub")
_ids = itertools.count(1)

CLOSE_SLOW = CloseCode.TRY_AGAIN  # the client fell too far behind


async def _finish(coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
    """Drive a coroutine that suspended outside any task: wait for what it waits on,
    resume it, repeat until it returns (what a Task does, for one started send)."""
    while True:
        if waiting is None:
            await asyncio.sleep(0)
        else:
            # a Task clears this flag on the future a coroutine yields; awaiting it with
            # the flag still set fails at once ("await wasn't used with future")
            waiting._asyncio_future_blocking = False
            try:
                await waiting
            except BaseException:  # noqa: BLE001 - the coroutine sees it when resumed
                pass
        try:
            waiting = coro.send(None)
        except StopIteration:
            return


class Conn:
    """One WebSocket. ``push`` sends at once: the ASGI send of the server completes
    without suspending while the socket is writable, so no task or queue is involved per
    frame. Behind uvicorn's WebSocket protocol, the frames pushed in one round of the loop
    are written together at its end instead (``corked``). When the transport pushes back
    (a slow reader), frames wait in a bounded backlog drained by a task; a client past
    the bound is dropped."""

    __slots__ = (
        "id",
        "user_id",
        "device_id",
        "token_hash",
        "issued_at",
        "_send",
        "backlog",
        "max_backlog",
        "closing",
        "tasks",
        "send_chain",
        "_drainer",
        "_proto",
        "_out",
    )

    def __init__(
        self,
        user_id: int,
        device_id: str,
        token_hash: bytes,
        send: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]],
        max_backlog: int,
    ) -> None:
        self.id = next(_ids)
        self.user_id = user_id
        self.device_id = device_id
        self.token_hash = token_hash
        # an app-signed token's issue time (ms; 0: it had no iat); None: a session's token
        self.issued_at: int | None = None
        self._send = send
        self.backlog: collections.deque[str] | None = None
        self.max_backlog = max_backlog
        self.closing = False
        self.tasks: set[asyncio.Task[Any]] = set()
        # the last send of this socket that runs in a task (one that mentions or replies
        # reads the store first); later sends wait for it, so seqs follow sending order
        self.send_chain: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._proto = direct_protocol(send)  # frames written through it (see corked)
        self._out: list[str] | None = None  # frames of this round, written by flush

    def push(self, text: str) -> bool:
        if self.closing:
            return False
        out = self._out
        if out is not None:
            out.append(text)
            return True
        if self.backlog is None and self._proto is not None and writable(self._proto):
            self._out = [text]
            ROUND.add(self)
            return True
        if self.backlog is not None:
            if len(self.backlog) >= self.max_backlog:
                metrics.DROPPED_SLOW.inc()
                log.warning("dropping slow connection %d of user %d", self.id, self.user_id)
                self.close(CLOSE_SLOW, "too slow: send queue full")
                return False
            self.backlog.append(text)
            return True
        coro = self._send({"type": "websocket.send", "text": text})
        try:
            waiting = coro.send(None)
        except StopIteration:
            return True
        except Exception:  # noqa: BLE001 - the client is gone
            self.closing = True
            return False
        self.backlog = collections.deque()
        self._drainer = asyncio.get_running_loop().create_task(self._drain(coro, waiting))
        return True

    def flush(self) -> None:
        """Write the frames of this round in one write (dropped if the socket closed in
        between: the client catches up when it reconnects)."""
        out, self._out = self._out, None
        if not out or self.closing or self._proto is None:
            return
        proto = self._proto
        if not still_open(proto):
            self.closing = True
            return
        frame = ROUND.frame
        proto.transport.write(frame(out[0]) if len(out) == 1 else b"".join(map(frame, out)))

    async def _drain(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        try:
            await _finish(coro, waiting)
            while self.backlog and not self.closing:
                await self._send({"type": "websocket.send", "text": self.backlog.popleft()})
        except Exception:  # noqa: BLE001
            self.closing = True
        finally:
            self.backlog = None

    def close(self, code: int, reason: str = "") -> None:
        if self.closing:
            return
        self.flush()  # frames pushed before the close go first
        self.closing = True
        if self._drainer is not None:
            self._drainer.cancel()

        async def _close() -> None:
            try:
                await self._send({"type": "websocket.close", "code": code, "reason": reason})
            except Exception:  # noqa: BLE001 - already gone
                pass

        asyncio.get_running_loop().create_task(_close())


class Hub:
    def __init__(self) -> None:
        self.by_user: dict[int, set[Conn]] = {}
        self.count = 0

    def add(self, conn: Conn) -> bool:
        """Register; True when this is the user's first connection here."""
        conns = self.by_user.get(conn.user_id)
        first = conns is None
        if conns is None:
            conns = self.by_user[conn.user_id] = set()
        conns.add(conn)
        self.count += 1
        metrics.CONNECTIONS.set(self.count)
        return first

    def remove(self, conn: Conn) -> bool:
        """Unregister; True when the user has no connection here any more."""
        conns = self.by_user.get(conn.user_id)
        if not conns or conn not in conns:
            return False
        conns.discard(conn)
        self.count -= 1
        metrics.CONNECTIONS.set(self.count)
        if not conns:
            del self.by_user[conn.user_id]
            return True
        return False

    def user_connections(self, user_id: int) -> int:
        return len(self.by_user.get(user_id, ()))

    def device_connections(self, user_id: int, device_id: str) -> int:
        """The device's sockets here (a user holds at most ``max_connections_per_user``)."""
        return sum(1 for c in self.by_user.get(user_id, ()) if c.device_id == device_id)

    def user_devices(self, user_id: int) -> set[str]:
        """The user's devices with a socket here."""
        return {c.device_id for c in self.by_user.get(user_id, ())}

    def deliver(self, user_ids: Iterable[int], text: str, exclude_conn: int | None = None) -> int:
        n = 0
        by_user = self.by_user
        for uid in user_ids:
            conns = by_user.get(uid)
            if not conns:
                continue
            for c in conns:
                if c.id != exclude_conn and c.push(text):
                    n += 1
        if n:
            metrics.PUSHES.inc(n)
        return n

    def close_where(self, pred: Callable[[Conn], bool], code: int, reason: str) -> int:
        n = 0
        for conns in list(self.by_user.values()):
            for c in list(conns):
                if pred(c):
                    c.close(code, reason)
                    n += 1
        return n

    def all(self) -> list[Conn]:
        return [c for conns in self.by_user.values() for c in conns]
