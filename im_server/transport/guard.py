"""``HttpGuard``: the ASGI layer between the server and the FastAPI app for HTTP.

A body over ``max_body_bytes`` is refused with 413 before the app, and so before
authentication, sees the request: at once from its ``Content-Length``, or, for a chunked
body, as soon as the bytes received pass the limit (at most the limit is buffered). The
413 carries ``Connection: close``, so the rest of the body is never read. Every response
gets the security headers of :mod:`im_server.transport.headers` (the page's CSP names
the object store's origin, from the app's settings).

A token in the query string (``?token=``, ``?access_token=``, in any spelling the query
parser decodes to those names) is refused with 400 before the app: only the WebSocket
endpoint takes its token there (browsers cannot set headers on an upgrade); anywhere
else a URL is what lands in logs, browser history and proxies, so a client that put a
token there is told to use the header instead of being served.

WebSocket scopes pass straight through (and ``/v1/ws`` does not even come here: it is
served in front of this layer by ``with_websocket``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI

from im_server.transport import headers

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def error_response(status: int, code: str, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of an error answered before the app, in the contract's form."""
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ], body


class HttpGuard:
    def __init__(self, app: FastAPI, max_body_bytes: int) -> None:
        self.app = app
        # ``with_websocket`` reads the gateway from the app's state
        self.state = app.state
        self.max_body_bytes = max_body_bytes
        docs = (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
        self.docs_paths = frozenset(p for p in docs if p)
        self._too_large = error_response(
            413, "too_large", f"the request body is over {max_body_bytes} bytes"
        )
        self._bad_length = error_response(400, "bad_request", "bad Content-Length")
        self._query_token = error_response(
            400,
            "bad_request",
            "a token goes in the Authorization header (Bearer), never in the URL",
        )
        # presigned URLs carry the public endpoint when there is one: that is the origin
        settings = getattr(app.state, "settings", None)
        endpoint = None
        if settings is not None:
            endpoint = settings.s3_public_endpoint or settings.s3_endpoint
        self.page_headers = headers.page_headers(headers.origin(endpoint))

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = headers.BASE if scope["path"] in self.docs_paths else self.page_headers

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        if has_query_token(scope.get("query_string", b"")):
            await self._refuse(send_with_headers, 400, self._query_token)
            return
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await self._refuse(send_with_headers, 400, self._bad_length)
                    return
                if int(value) > self.max_body_bytes:
                    await self._refuse(send_with_headers, 413, self._too_large)
                    return
            elif name == b"transfer-encoding":
                chunked = True
        if chunked:
            received = await self._read_capped(receive)
            if received is None:
                await self._refuse(send_with_headers, 413, self._too_large)
                return
            receive = _replay(received, receive)
        await self.app(scope, receive, send_with_headers)

    async def _read_capped(self, receive: Receive) -> deque[Message] | None:
        """The messages of a chunked body, or None once it passes the limit."""
        messages: deque[Message] = deque()
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            total += len(message.get("body", b""))
            if total > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return messages

    @staticmethod
    async def _refuse(
        send: Send, status: int, response: tuple[list[tuple[bytes, bytes]], bytes]
    ) -> None:
        head, body = response
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})


QUERY_TOKEN_NAMES = frozenset({"token", "access_token"})


def has_query_token(query: bytes) -> bool:
    """Whether the query string names a token, as ``urllib.parse`` decodes it (the
    WebSocket endpoint's parser): ``%74oken``, ``tok%65n`` and ``TOKEN`` included."""
    if b"=" not in query:
        return False
    names = (n.strip().lower() for n, _ in parse_qsl(query.decode("latin-1"), True))
    return any(n in QUERY_TOKEN_NAMES for n in names)


def _replay(messages: deque[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        if messages:
            return messages.popleft()
        return await receive()

    return replay
