"""``LeanWebSocketProtocol``: uvicorn's sans-I/O WebSocket protocol with less memory held
per open socket.

A gateway holds tens of thousands of sockets that are idle nearly all the time, so what
each one keeps between frames is what bounds a process. uvicorn's protocol keeps, for
the life of the socket, an ``asyncio.Queue`` for received events (three deques and an
``Event`` with a fourth), an ``asyncio.Event`` for writability (a fifth deque), and the
parsed handshake request and response with their headers: about 8 KiB of the ~20 KiB
a socket cost. Here the two waits are small slotted objects that allocate only while
someone waits, and the handshake's headers are dropped once answered. Behaviour is uvicorn's."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class Inbox:
    """The received ASGI events of one socket, for its one reader (the app's
    ``receive``): ``asyncio.Queue``'s ``put_nowait``/``get``/``empty`` without its
    deques. Reads pause after each message, so it rarely holds more than one."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = [item]
        else:
            self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        item = self._items.pop(0)
        if not self._items:
            self._items = None
        return item


class Writable:
    """Whether the transport takes more bytes: ``asyncio.Event``'s ``set``/``clear``/
    ``is_set``/``wait`` with its waiters' list made only when a send must wait."""

    __slots__ = ("_on", "_waiters")

    def __init__(self) -> None:
        self._on = True
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._on

    def set(self) -> None:
        self._on = True
        waiters, self._waiters = self._waiters, None
        for w in waiters or ():
            if not w.done():
                w.set_result(None)

    def clear(self) -> None:
        self._on = False

    async def wait(self) -> bool:
        if self._on:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class LeanWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Writable()  # type: ignore[assignment]

    def start_keepalive(self) -> None:
        """Called once, right after the handshake response is written: from here on the
        request and response are not read again."""
        # the library's parser keeps the request for ever: its headers, at least, can go
        self.request.headers.clear()
        self.request = None  # type: ignore[assignment]
        self.response = None  # type: ignore[assignment]
        super().start_keepalive()
