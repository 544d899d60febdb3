"""``DeadlineHttpProtocol``: uvicorn's httptools protocol with request deadlines and a cap
on the size of a request head.

uvicorn closes a connection that stays silent after a response (its keep-alive timer),
but any byte cancels that timer, and nothing bounds a connection that has not yet sent a
whole request: a client that never speaks, trickles its headers a byte at a time or never
finishes its body holds the socket for ever, and httptools buffers a header value of any
length. Here:

* the request head (request line and headers) must be complete ``header_timeout`` seconds
  after the connection opened, or after the previous response completed;
* the body must be complete ``body_timeout`` seconds after the head;
* the head may hold at most ``max_head_bytes`` (else 414 or 431);

else the connection is closed, with a 408 when a request had begun and no response has.
The deadline is cancelled when the connection is upgraded to a WebSocket (the WebSocket
keep-alive pings watch it from then on).

An upgrade request that the WebSocket library refuses to parse (a request line over its
8 KiB limit, say) is answered and closed here: uvicorn leaves such a connection open with
the library's answer unsent."""

from __future__ import annotations

import asyncio
import http

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from im_server.config import Settings
from im_server.transport import headers

MAX_HEAD_BYTES = 64 * 1024


def _response(status: int, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}".encode(),
        *(name + b": " + value for name, value in headers.BASE),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


TIMED_OUT = _response(408, "bad_request", "the request did not arrive in time")
BAD_REQUEST = _response(400, "bad_request", "invalid HTTP request")
URL_TOO_LONG = _response(414, "too_large", f"the request line is over {MAX_HEAD_BYTES} bytes")
HEAD_TOO_LARGE = _response(431, "too_large", f"the request headers are over {MAX_HEAD_BYTES} bytes")


class _HeadTooLarge(Exception):
    """Raised from a parser callback: httptools stops and reports a callback error."""


class DeadlineHttpProtocol(HttpToolsProtocol):
    header_timeout: float = 5.0
    body_timeout: float = 30.0
    max_head_bytes: int = MAX_HEAD_BYTES

    _deadline: asyncio.TimerHandle | None = None
    # waiting for (the rest of) a request head; then for its body
    _head_pending = True
    _body_pending = False
    # bytes of the pending head received so far, counted per read (httptools keeps a
    # header value in its own buffer until the value ends); heads completed so far
    _head_raw = 0
    _read_len = 0
    _heads = 0
    _refusal = b""

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the refusals above and the body deadline armed after a read
        that left a body incomplete."""
        self._unset_keepalive_if_required()
        heads, head_pending = self._heads, self._head_pending
        self._read_len = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._upgrade()
                return
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if not self._refusal:
                self.logger.warning("Invalid HTTP request received.")
            self._refuse(self._refusal or BAD_REQUEST)
            return
        if head_pending and self._head_pending and self._heads == heads:
            # all of this read belongs to the pending head
            self._head_raw += len(data)
            if self._head_raw > self.max_head_bytes:
                url = getattr(self, "url", b"")
                self._refuse(URL_TOO_LONG if len(url) > self.max_head_bytes else HEAD_TOO_LARGE)
                return
        if self._body_pending and self._deadline is None:
            self._arm(self.body_timeout)

    # -- parser callbacks ---------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self._disarm()
        if self._head_raw + self._read_len > self.max_head_bytes:
            # may be over: count exactly (a head that fits in the reads so far cannot be)
            if len(self.url) > self.max_head_bytes:
                self._refusal = URL_TOO_LONG
                raise _HeadTooLarge
            if len(self.url) + sum(len(n) + len(v) for n, v in self.headers) > self.max_head_bytes:
                self._refusal = HEAD_TOO_LARGE
                raise _HeadTooLarge
        self._head_pending = False
        self._head_raw = 0
        self._heads += 1
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._body_pending = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._body_pending = False
        self._head_pending = True
        if self.cycle is not None and self.cycle.response_complete:
            # answered before its body was in: the next head's clock starts now
            self._arm(self.header_timeout)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if (
            self._head_pending
            and self._deadline is None
            and self.cycle.response_complete
            and not self.transport.is_closing()
        ):
            self._arm(self.header_timeout)

    # -- deadlines and refusals ---------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        # silent since the last response (or since it opened): close without a word
        begun = self._body_pending or self._head_raw > 0
        self._refuse(TIMED_OUT if begun else b"")

    def _refuse(self, response: bytes) -> None:
        """Answer ``response`` (unless a response is under way) and close."""
        self._disarm()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started or self.pipeline:
                response = b""
            cycle.disconnected = True
            cycle.message_event.set()
        if response:
            self.transport.write(response)
        self.transport.close()

    def _upgrade(self) -> None:
        self._disarm()
        self.handle_websocket_upgrade()
        ws = self.transport.get_protocol()
        if isinstance(ws, WebSocketsSansIOProtocol) and not ws.handshake_initiated:
            self.transport.write(b"".join(ws.conn.data_to_send()))
            self.transport.close()


def http_protocol(settings: Settings) -> type[DeadlineHttpProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, with the settings' deadlines."""

    class ImHttpProtocol(DeadlineHttpProtocol):
        header_timeout = settings.request_header_timeout_seconds
        body_timeout = settings.request_body_timeout_seconds

    return ImHttpProtocol
