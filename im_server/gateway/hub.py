"""Live connections of this process. Each has a bounded send queue drained by its own
writer task: a broadcast never awaits a client, and a client that cannot keep up is
dropped instead of stalling everyone."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from im_server import metrics

log = logging.getLogger("im_server.hub")
_ids = itertools.count(1)

CLOSE_SLOW = 1013  # try again later: the client fell too far behind


class Conn:
    __slots__ = (
        "id",
        "user_id",
        "device_id",
        "token_hash",
        "queue",
        "_send",
        "_close",
        "closing",
        "tasks",
    )

    def __init__(
        self,
        user_id: int,
        device_id: str,
        token_hash: bytes,
        send: Callable[[str], Any],
        close: Callable[[int, str], Any],
        queue_size: int,
    ) -> None:
        self.id = next(_ids)
        self.user_id = user_id
        self.device_id = device_id
        self.token_hash = token_hash
        self.queue: asyncio.Queue[str] = asyncio.Queue(queue_size)
        self._send = send
        self._close = close
        self.closing = False
        self.tasks: set[asyncio.Task[Any]] = set()

    def push(self, text: str) -> bool:
        if self.closing:
            return False
        try:
            self.queue.put_nowait(text)
            return True
        except asyncio.QueueFull:
            metrics.DROPPED_SLOW.inc()
            log.warning("dropping slow connection %d of user %d", self.id, self.user_id)
            self.close(CLOSE_SLOW, "too slow: send queue full")
            return False

    def close(self, code: int, reason: str = "") -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().create_task(self._close(code, reason))

    async def writer(self) -> None:
        q = self.queue
        send = self._send
        while True:
            text = await q.get()
            await send(text)
            metrics.PUSHES.inc()


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
