"""Async client for the IM server: REST calls, one WebSocket, and a syncing device.

Used by the integration tests, the benchmark and the terminal chat, so it speaks the
public contract (PROTOCOL.md) and nothing else: no server module is imported here.

* :class:`Client` wraps the REST API for one user session (``Authorization: Bearer``).
  Any non-2xx answer raises :class:`ApiError`, so callers (tests above all) can assert on
  ``status`` and ``code`` instead of parsing bodies.
* :class:`Connection` is one WebSocket. A single reader task owns ``recv()``; ``ack``
  frames resolve the future of the ``send`` that carried the same ``client_msg_id`` (so
  many sends may be in flight at once), ``pong`` frames resolve pings in FIFO order, and
  every other frame goes to :attr:`Connection.events` and to the registered callbacks.
* :class:`Device` combines both with :class:`~im_server.client_sync.SyncState` to follow
  the catch-up recipe: socket first, then sync, then pull the missing seq ranges.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import quote

import httpx
import orjson
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from im_server.client_sync import Device, SeqRange, SyncState

__all__ = [
    "ApiError",
    "Client",
    "Connection",
    "ConnectionLost",
    "Device",
    "SeqRange",
    "SyncState",
    "group_conv_id",
    "single_conv_id",
]

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], Awaitable[None] | None]

WS_MAX_SIZE = 1 << 20
"""Largest frame accepted from the server; history-sized frames never travel on the WS."""

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    422: "bad_request",
    429: "rate_limited",
    503: "unavailable",
}


def single_conv_id(a: int, b: int) -> str:
    """The single-chat conv_id, which clients may compute themselves: ``s:<lo>:<hi>``."""
    lo, hi = sorted((int(a), int(b)))
    return f"s:{lo}:{hi}"


def group_conv_id(group_id: int) -> str:
    return f"g:{int(group_id)}"


def _content(content: Any) -> Any:
    """A bare string is shorthand for a text body ``{"text": ...}``; anything else is
    sent as given, so that tests can still send malformed content on purpose."""
    return {"text": content} if isinstance(content, str) else content


def _send_body(
    conv_id: str, content: Any, content_type: str, client_msg_id: str | None
) -> dict[str, Any]:
    return {
        "client_msg_id": client_msg_id or uuid.uuid4().hex,
        "conv_id": conv_id,
        "content_type": content_type,
        "content": _content(content),
    }


class ApiError(Exception):
    """A refused REST call (or WebSocket upgrade): HTTP status plus the contract's
    ``{"error": {"code", "message"}}``. ``code`` falls back to a name derived from the
    status when the body is not the contract's error shape (a proxy, a crash page)."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def from_response(cls, status: int, body: bytes) -> ApiError:
        code = _STATUS_CODES.get(status, f"http_{status}")
        message = body.decode("utf-8", "replace")[:500]
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.loads(body)
            err = data.get("error") if isinstance(data, dict) else None
            if isinstance(err, dict):
                code = str(err.get("code") or code)
                message = str(err.get("message") or "")
        return cls(status, code, message)


class ConnectionLost(ConnectionError):
    """The WebSocket is closed; raised by sends, pings and waits that can no longer be
    answered. ``code`` is the close code (4401 for a revoked token, 1009 too big...)."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        super().__init__(f"websocket closed (code={code}, reason={reason!r})")
        self.code = code
        self.reason = reason


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
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.closed = asyncio.Event()
        self._queue_events = queue_events
        self._backlog: deque[dict[str, Any]] = deque()  # skipped over by next_event
        self._acks: dict[str, deque[asyncio.Future[dict[str, Any]]]] = {}
        self._pongs: deque[asyncio.Future[dict[str, Any]]] = deque()
        self._callbacks: list[EventCallback] = [on_event] if on_event else []
        self._cb_tasks: set[asyncio.Task[Any]] = set()
        self._reader = asyncio.create_task(self._read_loop(), name="im-client-ws-reader")

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

    def _emit(self, frame: dict[str, Any]) -> None:
        if self._queue_events:
            self.events.put_nowait(frame)
        for cb in self._callbacks:
            try:
                result = cb(frame)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._cb_tasks.add(task)
                    task.add_done_callback(self._cb_tasks.discard)
            except Exception:
                log.exception("websocket event callback failed")

    async def next_event(
        self,
        type: str | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109 - part of the public API
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The oldest frame of ``type`` (any type if None) that satisfies ``predicate``.

        Frames that do not match are kept, in arrival order, for later calls, so a test
        can wait for the ``read`` it expects without losing the ``message`` that came
        first. Raises ``TimeoutError`` after ``timeout`` seconds, and
        :class:`ConnectionLost` once the socket is closed and nothing matching is left.
        """

        def match(f: dict[str, Any]) -> bool:
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
        timeout: float = 0.5,  # noqa: ASYNC109 - part of the public API
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """Like :meth:`next_event`, but None on timeout: for "nothing arrives" checks."""
        try:
            return await self.next_event(type, timeout, predicate)
        except TimeoutError:
            return None

    def pending_events(self) -> list[dict[str, Any]]:
        """Take every frame received and not consumed yet (backlog, then queue)."""
        out = list(self._backlog)
        self._backlog.clear()
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    async def _next_frame(self, deadline: float) -> dict[str, Any]:
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
    ) -> asyncio.Future[dict[str, Any]]:
        """Send a message and return the future of its ack without waiting for it.

        Lets a benchmark keep a window of sends in flight on one socket. The future
        fails with :class:`ConnectionLost` if the socket closes before the ack.
        """
        body = _send_body(conv_id, content, content_type, client_msg_id)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
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
        timeout: float = 10.0,  # noqa: ASYNC109 - part of the public API
    ) -> dict[str, Any]:
        """Send a message; return its ``ack`` frame, whether ``ok`` is true or false.

        With ``wait=False`` the frame is written and returned as sent (with its
        ``client_msg_id``); its ack then arrives on :attr:`events` like any frame.
        """
        if not wait:
            frame = {"type": "send", **_send_body(conv_id, content, content_type, client_msg_id)}
            await self._send_frame(frame)
            return frame
        fut = await self.send_nowait(conv_id, content, content_type, client_msg_id)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            for cmid, waiters in list(self._acks.items()):
                if fut in waiters:
                    self._forget(cmid, fut)
            raise

    def _forget(self, client_msg_id: str, fut: asyncio.Future[dict[str, Any]]) -> None:
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

    async def ping(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Application-level ping; returns when the matching ``pong`` arrives."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
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
            await asyncio.wait_for(asyncio.shield(self._reader), 5.0)

    async def wait_closed(self, timeout: float = 5.0) -> int | None:  # noqa: ASYNC109
        """Wait until the server closes the socket; return the close code."""
        await asyncio.wait_for(self.closed.wait(), timeout)
        return self.close_code


class Client:
    """REST + WebSocket client for one user session.

    ``http`` may be shared by many clients (a benchmark with thousands of users wants
    one connection pool): every request carries its own token and absolute URL, and a
    shared pool is not closed by :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        user_id: int | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.user_id = user_id
        self.username: str | None = None
        self.device_id: str | None = None
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))
        self._conns: set[Connection] = set()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Client user_id={self.user_id} username={self.username!r}>"

    # -- plumbing ----------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpx's own timeout
    ) -> Any:
        """One REST call; the decoded JSON body, None for 204, :class:`ApiError` for any
        non-2xx. Public so that tests can send what the typed methods would not."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        content = None
        if json is not None:
            content = orjson.dumps(json)
            headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        resp = await self.http.request(
            method,
            self.base_url + path,
            content=content,
            params=query or None,
            headers=headers,
            **extra,
        )
        if resp.status_code >= 300:
            raise ApiError.from_response(resp.status_code, resp.content)
        if resp.status_code == 204 or not resp.content:
            return None
        return orjson.loads(resp.content)

    @staticmethod
    def _c(conv_id: str) -> str:
        return "/v1/conversations/" + quote(conv_id, safe=":")

    # -- accounts ----------------------------------------------------------------------
    @classmethod
    async def register(
        cls,
        base_url: str,
        username: str,
        password: str,
        display_name: str | None = None,
        *,
        device_id: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> Client:
        """Create the account, then log in: the returned client holds a token."""
        client = cls(base_url, http=http)
        try:
            body: dict[str, Any] = {"username": username, "password": password}
            if display_name is not None:
                body["display_name"] = display_name
            await client.request("POST", "/v1/users", json=body)
            await client._login(username, password, device_id)
        except BaseException:
            await client.aclose()
            raise
        return client

    @classmethod
    async def login(
        cls,
        base_url: str,
        username: str,
        password: str,
        device_id: str | None = None,
        *,
        http: httpx.AsyncClient | None = None,
    ) -> Client:
        client = cls(base_url, http=http)
        try:
            await client._login(username, password, device_id)
        except BaseException:
            await client.aclose()
            raise
        return client

    async def _login(self, username: str, password: str, device_id: str | None) -> None:
        body: dict[str, Any] = {"username": username, "password": password}
        if device_id is not None:
            body["device_id"] = device_id
        data = await self.request("POST", "/v1/sessions", json=body)
        self.token, self.user_id = data["token"], int(data["user_id"])
        self.device_id, self.username = data.get("device_id"), username

    async def me(self) -> dict[str, Any]:
        data = await self.request("GET", "/v1/me")
        self.user_id, self.username = int(data["user_id"]), data.get("username")
        return data

    async def logout(self) -> None:
        """Revoke this token. It is kept on the object, so tests can check it is dead."""
        await self.request("DELETE", "/v1/sessions/current")

    async def sessions(self) -> list[dict[str, Any]]:
        """My live sessions: ``[{device_id, created_at, last_used_at, current}]``."""
        return await self.request("GET", "/v1/sessions")

    async def revoke_session(self, device_id: str) -> None:
        """Revoke my session on another device (or this one)."""
        await self.request("DELETE", "/v1/sessions/" + quote(device_id, safe=""))

    async def logout_everywhere(self) -> None:
        """Revoke every session of mine, this token's too."""
        await self.request("DELETE", "/v1/sessions")

    async def change_password(self, old_password: str, new_password: str) -> None:
        """Every other session of mine is revoked; this token stays valid."""
        body = {"old_password": old_password, "new_password": new_password}
        await self.request("PUT", "/v1/me/password", json=body)

    async def lookup_user(self, username: str) -> dict[str, Any]:
        """``{user_id, username, display_name}`` of the user with that username."""
        return await self.request("GET", "/v1/users/lookup", params={"username": username})

    # -- friends / blocks --------------------------------------------------------------
    async def request_friend(self, to_user_id: int, note: str | None = None) -> int:
        body: dict[str, Any] = {"to_user_id": to_user_id}
        if note is not None:
            body["note"] = note
        return int((await self.request("POST", "/v1/friends/requests", json=body))["request_id"])

    async def friend_requests(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/friends/requests")

    async def accept_friend(self, request_id: int) -> str:
        data = await self.request("POST", f"/v1/friends/requests/{request_id}/accept")
        return str(data["conv_id"])

    async def friends(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/v1/friends")

    async def remove_friend(self, user_id: int) -> None:
        await self.request("DELETE", f"/v1/friends/{user_id}")

    async def block(self, user_id: int) -> None:
        await self.request("PUT", f"/v1/blocks/{user_id}")

    async def unblock(self, user_id: int) -> None:
        await self.request("DELETE", f"/v1/blocks/{user_id}")

    async def blocks(self) -> list[int]:
        return [int(u) for u in await self.request("GET", "/v1/blocks")]

    # -- groups ------------------------------------------------------------------------
    async def create_group(self, name: str, member_ids: list[int]) -> dict[str, Any]:
        body = {"name": name, "member_ids": member_ids}
        return await self.request("POST", "/v1/groups", json=body)

    async def add_members(
        self, group_id: int, user_ids: list[int], with_history: bool = False
    ) -> dict[str, Any]:
        body = {"user_ids": user_ids, "with_history": with_history}
        return await self.request("POST", f"/v1/groups/{group_id}/members", json=body) or {}

    async def kick(self, group_id: int, user_id: int) -> None:
        await self.request("DELETE", f"/v1/groups/{group_id}/members/{user_id}")

    async def leave(self, group_id: int) -> None:
        await self.request("POST", f"/v1/groups/{group_id}/leave")

    async def members(self, group_id: int) -> list[dict[str, Any]]:
        return await self.request("GET", f"/v1/groups/{group_id}/members")

    # -- conversations -----------------------------------------------------------------
    async def conversations(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/v1/conversations")

    async def history(
        self,
        conv_id: str,
        begin: int | None = None,
        end: int | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> dict[str, Any]:
        params = {"begin": begin, "end": end, "limit": limit, "order": order}
        return await self.request("GET", self._c(conv_id) + "/messages", params=params)

    async def send_rest(
        self,
        conv_id: str,
        content: Any,
        content_type: str = "text",
        client_msg_id: str | None = None,
    ) -> dict[str, Any]:
        """Send through REST; same pipeline and ack body as the WebSocket ``send``."""
        body = _send_body(conv_id, content, content_type, client_msg_id)
        return await self.request("POST", self._c(conv_id) + "/messages", json=body)

    async def read_rest(self, conv_id: str, seq: int) -> dict[str, Any]:
        return await self.request("POST", self._c(conv_id) + "/read", json={"seq": seq})

    async def clear(self, conv_id: str) -> Any:
        return await self.request("POST", self._c(conv_id) + "/clear")

    async def hide(self, conv_id: str) -> None:
        await self.request("DELETE", self._c(conv_id))

    async def recall(self, conv_id: str, seq: int) -> Any:
        return await self.request("POST", f"{self._c(conv_id)}/messages/{seq}/recall")

    async def receipts(self, conv_id: str, seq: int) -> dict[str, Any]:
        return await self.request("GET", f"{self._c(conv_id)}/messages/{seq}/receipts")

    async def unread(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/unread")

    async def sync(
        self,
        since: int = 0,
        wait: float | None = None,
        limit: int | None = None,
        recent: int | None = None,
    ) -> dict[str, Any]:
        """``/v1/sync``; a long poll (``wait``) gets a read timeout beyond the wait."""
        params = {"since": since, "wait": wait, "limit": limit, "recent": recent}
        timeout = None if not wait else float(wait) + 15.0
        return await self.request("GET", "/v1/sync", params=params, timeout=timeout)

    # -- websocket ---------------------------------------------------------------------
    def ws_url(self) -> str:
        base = self.base_url
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return f"{base}/v1/ws?token={quote(self.token or '', safe='')}"

    async def connect(
        self,
        *,
        on_event: EventCallback | None = None,
        queue_events: bool = True,
        **ws_options: Any,
    ) -> Connection:
        """Open a WebSocket with this token.

        An upgrade refused with an HTTP status raises :class:`ApiError` (401/403 for a
        bad token). A server that accepts and then closes (4401) yields a
        :class:`Connection` whose :attr:`~Connection.closed` is set soon after.
        Compression is off by default: frames are small and the benchmark should
        measure the server, not zlib; ``ws_options`` override any default.
        """
        options: dict[str, Any] = {
            "max_size": WS_MAX_SIZE,
            "open_timeout": 10,
            "compression": None,
        }
        options.update(ws_options)
        try:
            ws = await ws_connect(self.ws_url(), **options)
        except InvalidStatus as exc:
            resp = exc.response
            raise ApiError.from_response(resp.status_code, bytes(resp.body or b"")) from exc
        conn = Connection(ws, on_event=on_event, queue_events=queue_events)
        self._conns.add(conn)
        conn._reader.add_done_callback(lambda _t: self._conns.discard(conn))
        return conn

    async def aclose(self) -> None:
        """Close every socket opened by this client, then the HTTP pool if owned."""
        conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
        if self._own_http:
            await self.http.aclose()
