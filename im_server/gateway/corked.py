"""Frames to one socket written together: what a connection is sent in one round of the
event loop (the acks of a batch of sends, the messages a batch delivers to a receiver)
goes out in a single transport write at the end of the round, instead of one ASGI send
and one syscall per frame.

Why here and not in the ASGI server: a write costs a syscall and, on loopback, the
receiver's TCP work too; under load a socket is typically sent several frames per round.
The ASGI interface has no "several frames" message, so a connection served by uvicorn's
sans-I/O WebSocket protocol is written to through that protocol's transport, with the
frames built here (a server frame is unmasked: a short header, then the payload). Only
while that protocol would itself write at once (handshake done, no close sent, the
transport not pushing back, the WebSocket open); otherwise, and for any other server, the
ASGI send is used as before."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any, Protocol

try:  # the protocol ``im-server serve`` runs (uvicorn, ws="websockets-sansio")
    from uvicorn.protocols.websockets.websockets_sansio_impl import (
        WebSocketsSansIOProtocol as _SansIO,
    )
    from websockets.protocol import State as _WsState

    DIRECT_PROTOCOLS: tuple[type, ...] = (_SansIO,)
    _OPEN: Any = _WsState.OPEN
except ImportError:  # pragma: no cover - another ASGI server: the ASGI path only
    DIRECT_PROTOCOLS = ()
    _OPEN = None

log = logging.getLogger("im_server.corked")
# what is read of the protocol object (uvicorn's attributes, checked once per socket)
_READS = (
    "transport",
    "conn",
    "writable",
    "handshake_complete",
    "close_sent",
    "disconnected",
    "initial_response",
)
_PACK16 = struct.Struct("!BBH").pack
_PACK64 = struct.Struct("!BBQ").pack


def text_frame(payload: bytes) -> bytes:
    """One unfragmented, unmasked text frame (RFC 6455 §5.2) carrying ``payload``."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return _PACK16(0x81, 126, n) + payload
    return _PACK64(0x81, 127, n) + payload


class Flushable(Protocol):
    def flush(self) -> None: ...


def direct_protocol(send: Callable[..., Any]) -> Any | None:
    """The WebSocket protocol object behind an ASGI ``send``, when frames can be
    written through it directly; else None."""
    proto: Any = getattr(send, "__self__", None)
    if proto is None or not DIRECT_PROTOCOLS or not isinstance(proto, DIRECT_PROTOCOLS):
        return None
    if not all(hasattr(proto, a) for a in _READS) or not hasattr(
        getattr(proto, "conn", None), "state"
    ):
        return None  # a version of the protocol this module does not know: ASGI send
    return proto


def writable(proto: Any) -> bool:
    """Would the protocol write a data frame at once right now?"""
    return bool(
        proto.handshake_complete
        and not proto.close_sent
        and not proto.disconnected
        and proto.initial_response is None
        and proto.writable.is_set()
        and proto.conn.state is _OPEN
    )


def still_open(proto: Any) -> bool:
    """May data frames still be written? (The frames of a round are written even while
    the transport pushes back: they were taken before it did.)"""
    return bool(
        proto.conn.state is _OPEN
        and not proto.close_sent
        and not proto.disconnected
        and not proto.transport.is_closing()
    )


class Round:
    """The connections with frames waiting in this round of the loop; one callback per
    round writes them all. A text pushed to many sockets (a group message fanned out to
    its members) is encoded and framed once per round, not once per socket."""

    __slots__ = ("pending", "loop", "_frames")

    def __init__(self) -> None:
        self.pending: list[Flushable] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        # id(text) -> (text, frame); holding the text keeps its id from being reused
        self._frames: dict[int, tuple[str, bytes]] = {}

    def frame(self, text: str) -> bytes:
        """``text`` as a frame, built once however many sockets it goes to."""
        hit = self._frames.get(id(text))
        if hit is not None:
            return hit[1]
        frame = text_frame(text.encode())
        self._frames[id(text)] = (text, frame)
        return frame

    def add(self, conn: Flushable) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # the first this round (or left over from a closed loop)
            self.pending.clear()
            self.loop = loop
            loop.call_soon(self.flush)
        self.pending.append(conn)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        self.loop = None
        try:
            for conn in pending:
                try:
                    conn.flush()
                except Exception:  # one socket's fault must not hold back the others'
                    log.exception("writing a round of frames failed")
        finally:
            self._frames.clear()


ROUND = Round()
