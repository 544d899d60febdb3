"""One WebSocket of the client: :class:`Connection`, and :func:`open_connection`.

A single reader task owns ``recv()``. Every frame the server sends goes through
:meth:`Connection._dispatch`: an ``ack`` resolves the future of the ``send`` that carried
the same ``client_msg_id`` (so many sends may be in flight at once), a ``pong`` resolves
the oldest ping, and every other frame goes to :attr:`Connection.events` and to the
registered callbacks. The socket is not reopened here: a caller that wants to survive a
lost connection (the chaos harness, a device) opens a new one and resends with the same
``client_msg_id``, which the server answers ``duplicate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import quote

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from im_server.client.errors import ApiError, ConnectionLost
from im_server.client.wire import JsonObject, send_body

log = logging.getLogger("im_server.client")

EventCallback = Callable[[JsonObject], Awaitable[None] | None]

WS_MAX_SIZE = 1 << 20
"""Largest frame accepted from the server; history-sized frames never travel on the WS."""


def ws_url(base_url: str, token: str | None) -> str:
    """The WebSocket URL of a server given by its HTTP base URL."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return f"{base}/v1/ws?token={quote(token or '', safe='')}"


async def open_connection(
    url: str,
    *,
    on_event: EventCallback | None = None,
    queue_events: bool = True,
    **ws_options: Any,
) -> Connection:
    """Open a WebSocket at ``url`` (see :meth:`~im_server.client.Client.connect`).

    An upgrade refused with an HTTP status raises :class:`ApiError`. Compression is off
    by default: frames are small and the benchmark should measure the server, not zlib;
    ``ws_options`` (passed to ``websockets``' ``connect``) override any default.
    """
    options: dict[str, Any] = {
        "max_size": WS_MAX_SIZE,
        "open_timeout": 10,
        "compression": None,
    }
    options.update(ws_options)
    try:
        ws = await ws_connect(url, **options)
    except InvalidStatus as exc:
        resp = exc.response
        raise ApiError.from_response(resp.status_code, bytes(resp.body or b"")) from exc
    return Connection(ws, on_event=on_event, queue_events=queue_events)


class Connection:
    """One WebSocket: a reader task parses frames and routes them (see module doc)."""

    frame_hooks: ClassVar[list[Callable[[bytes], None]]] = []
    """Called with every frame received, before it is routed, on every connection (the
    test suite checks each against the server's published frame schema)."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        on_event: EventCallback | None = None,
        queue_events: bool = True,
    ) -> None:
        self.ws = ws
        self.events: asyncio.Queue[JsonObject] = asyncio.Queue()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.closed = asyncio.Event()
        self._queue_events = queue_events
        self._backlog: deque[JsonObject] = deque()  # skipped over by next_event
        self._acks: dict[str, deque[asyncio.Future[JsonObject]]] = {}
        self._pongs: deque[asyncio.Future[JsonObject]] = deque()
        self._callbacks: list[EventCallback] = [on_event] if on_event else []
        self._cb_tasks: set[asyncio.Future[None]] = set()
        # the task that receives every frame (see _dispatch); done once the socket closes
        self.reader = asyncio.create_task(self._read_loop(), name="im-client-ws-reader")

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def on_event(self, callback: EventCallback) -> None:
        """Also call ``callback(frame)`` for every non-ack, non-pong frame; a coroutine
        function is run as a task so that a slow handler never stalls the reader."""
        self._callbacks.append(callback)

    # -- reading -----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                self._dispatch(await self.ws.recv(decode=False))
        except ConnectionClosed:
            pass
        except Exception:  # a bug here must not leave waiters hanging
            log.exception("websocket reader failed")
            await self.ws.close(1011)
        finally:
            self.close_code = self.ws.close_code
            self.close_reason = self.ws.close_reason
            exc = ConnectionLost(self.close_code, self.close_reason)
            pending = [f for q in self._acks.values() for f in q] + list(self._pongs)
            self._acks.clear()
            self._pongs.clear()
            for fut in pending:
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # retrieved: no "never retrieved" noise if unawaited
            self.closed.set()

    def _dispatch(self, raw: bytes) -> None:
        """Route one frame received from the server (every frame passes here)."""
        for hook in self.frame_hooks:
            hook(raw)
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError:
            frame = {"type": "invalid", "raw": raw.decode("utf-8", "replace")}
        if not isinstance(frame, dict):
            frame = {"type": "invalid", "raw": frame}
        kind = frame.get("type")
        if kind == "ack":
            waiters = self._acks.get(str(frame.get("client_msg_id")))
            while waiters:
                fut = waiters.popleft()
                if not fut.done():  # a timed-out send left a cancelled future behind
                    if not waiters:
                        del self._acks[str(frame.get("client_msg_id"))]
                    fut.set_result(frame)
                    return
        elif kind == "pong":
            while self._pongs:
                fut = self._pongs.popleft()
                if not fut.done():
                    fut.set_result(frame)
                    return
        self._emit(frame)

    def _emit(self, frame: JsonObject) -> None:
        if self._queue_events:
            self.events.put_nowait(frame)
        for cb in self._callbacks:
            try:
                result = cb(frame)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._cb_tasks.add(task)
                    task.add_done_callback(self._cb_tasks.discard)
            except Exception:  # the caller's callback: log, keep reading
                log.exception("websocket event callback failed")

    async def next_event(
        self,
        type: str | None = None,
        timeout: float = 5.0,  # part of the public API
        predicate: Callable[[JsonObject], bool] | None = None,
    ) -> JsonObject:
        """The oldest frame of ``type`` (any type if None) that satisfies ``predicate``.

        Frames that do not match are kept, in arrival order, for later calls, so a test
        can wait for the ``read`` it expects without losing the ``message`` that came
        first. Raises ``TimeoutError`` after ``timeout`` seconds, and
        :class:`ConnectionLost` once the socket is closed and nothing matching is left.
        """

        def match(f: JsonObject) -> bool:
            return (type is None or f.get("type") == type) and (
                predicate is None or bool(predicate(f))
            )

        for i, f in enumerate(self._backlog):
            if match(f):
                del self._backlog[i]
                return f
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            f = await self._next_frame(deadline)
            if match(f):
                return f
            self._backlog.append(f)

    async def try_next_event(
        self,
        type: str | None = None,
        timeout: float = 0.5,  # part of the public API
        predicate: Callable[[JsonObject], bool] | None = None,
    ) -> JsonObject | None:
        """Like :meth:`next_event`, but None on timeout: for "nothing arrives" checks."""
        try:
            return await self.next_event(type, timeout, predicate)
        except TimeoutError:
            return None

    def pending_events(self) -> list[JsonObject]:
        """Take every frame received and not consumed yet (backlog, then queue)."""
        out = list(self._backlog)
        self._backlog.clear()
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    async def _next_frame(self, deadline: float) -> JsonObject:
        loop = asyncio.get_running_loop()
        while True:
            if not self.events.empty():
                return self.events.get_nowait()
            if self.closed.is_set():
                raise ConnectionLost(self.close_code, self.close_reason)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("no matching websocket event")
            getter = asyncio.ensure_future(self.events.get())
            closer = asyncio.ensure_future(self.closed.wait())
            try:
                await asyncio.wait(
                    {getter, closer}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for t in (getter, closer):
                    if not t.done():
                        t.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    # -- writing -----------------------------------------------------------------------
    async def _send_frame(self, frame: Mapping[str, Any]) -> None:
        try:
            await self.ws.send(orjson.dumps(frame), text=True)
        except ConnectionClosed as exc:
            raise ConnectionLost(self.ws.close_code, self.ws.close_reason) from exc

    async def send_nowait(
        self,
        conv_id: str,
        content: Any,
        content_type: str = "text",
        client_msg_id: str | None = None,
        *,
        mentions: list[int] | None = None,
        mention_all: bool = False,
        reply_to: int | None = None,
    ) -> asyncio.Future[JsonObject]:
        """Send a message and return the future of its ack without waiting for it.

        Lets a benchmark keep a window of sends in flight on one socket. The future
        fails with :class:`ConnectionLost` if the socket closes before the ack.
        """
        body = send_body(
            conv_id,
            content,
            content_type,
            client_msg_id,
            mentions=mentions,
            mention_all=mention_all,
            reply_to=reply_to,
        )
        fut: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        waiters = self._acks.setdefault(body["client_msg_id"], deque())
        waiters.append(fut)
        try:
            await self._send_frame({"type": "send", **body})
        except BaseException:
            self._forget(body["client_msg_id"], fut)
            raise
        return fut

    async def send(
        self,
        conv_id: str,
        content: Any,
        content_type: str = "text",
        client_msg_id: str | None = None,
        *,
        wait: bool = True,
        timeout: float = 10.0,  # part of the public API
        mentions: list[int] | None = None,
        mention_all: bool = False,
        reply_to: int | None = None,
    ) -> JsonObject:
        """Send a message; return its ``ack`` frame, whether ``ok`` is true or false.

        With ``wait=False`` the frame is written and returned as sent (with its
        ``client_msg_id``); its ack then arrives on :attr:`events` like any frame.
        ``mentions`` (group members to mention), ``mention_all`` and ``reply_to`` (a
        seq) are sent only when given.
        """
        extra: dict[str, Any] = {
            "mentions": mentions,
            "mention_all": mention_all,
            "reply_to": reply_to,
        }
        if not wait:
            body = send_body(conv_id, content, content_type, client_msg_id, **extra)
            frame = {"type": "send", **body}
            await self._send_frame(frame)
            return frame
        fut = await self.send_nowait(conv_id, content, content_type, client_msg_id, **extra)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            for cmid, waiters in list(self._acks.items()):
                if fut in waiters:
                    self._forget(cmid, fut)
            raise

    def _forget(self, client_msg_id: str, fut: asyncio.Future[JsonObject]) -> None:
        waiters = self._acks.get(client_msg_id)
        if waiters is not None:
            with contextlib.suppress(ValueError):
                waiters.remove(fut)
            if not waiters:
                del self._acks[client_msg_id]

    async def read(self, conv_id: str, seq: int) -> None:
        """Report my read cursor (no answer frame; other devices get ``read``)."""
        await self._send_frame({"type": "read", "conv_id": conv_id, "seq": seq})

    async def delivered(self, conv_id: str, seq: int) -> None:
        await self._send_frame({"type": "delivered", "conv_id": conv_id, "seq": seq})

    async def typing(self, conv_id: str) -> None:
        await self._send_frame({"type": "typing", "conv_id": conv_id})

    async def edit(self, conv_id: str, seq: int, content: Any, timeout: float = 10.0) -> JsonObject:
        """Send an ``edit`` frame and return its answer: the ``edited`` frame for this
        message, or the next ``error`` frame (errors name no frame: send one edit at a
        time on a socket to tell them apart). Needs ``queue_events``."""
        body = {"text": content} if isinstance(content, str) else content
        await self._send_frame({"type": "edit", "conv_id": conv_id, "seq": seq, "content": body})

        def answer(f: JsonObject) -> bool:
            if f.get("type") == "error":
                return True
            return f.get("type") == "edited" and f.get("conv_id") == conv_id and f.get("seq") == seq

        return await self.next_event(None, timeout, answer)

    async def ping(self, timeout: float = 5.0) -> None:
        """Application-level ping; returns when the matching ``pong`` arrives."""
        fut: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._pongs.append(fut)
        try:
            await self._send_frame({"type": "ping"})
            await asyncio.wait_for(fut, timeout)
        finally:
            with contextlib.suppress(ValueError):
                self._pongs.remove(fut)

    async def send_raw(self, data: str | bytes, *, text: bool | None = None) -> None:
        """Write one frame verbatim (str: text frame, bytes: binary unless ``text``),
        for tests of malformed and oversized input."""
        try:
            await self.ws.send(data, text=text)
        except ConnectionClosed as exc:
            raise ConnectionLost(self.ws.close_code, self.ws.close_reason) from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code, reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.reader), 5.0)

    async def wait_closed(self, timeout: float = 5.0) -> int | None:
        """Wait until the server closes the socket; return the close code."""
        await asyncio.wait_for(self.closed.wait(), timeout)
        return self.close_code
