"""One WebSocket connection's protocol, sans I/O (the design of the websockets library's
``protocol.py``): received frames go in, commands come out; results go in, frames to send
come out. No socket, no asyncio, no store here, so every rule of the conversation between
a client and the server is tested without any (``tests/unit/test_session.py``).

The gateway (``gateway/ws.py``) only moves data: it feeds each received frame to
:meth:`Session.receive`, carries out the command it gets (a service call, a frame to send
at once, a close) and sends the frames the session makes of the results."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from pydantic import JsonValue

from im_server.errors import ImError
from im_server.protocol.attachments import ATTACHMENT_TYPES
from im_server.protocol.client_frames import (
    EditFrame,
    FrameError,
    PingFrame,
    ReadFrame,
    SendFrame,
    TypingFrame,
    parse_client_frame,
)
from im_server.protocol.close_codes import CloseCode
from im_server.protocol.server_frames import (
    PONG,
    AckOk,
    Edited,
    encode,
    error_frame,
    refused_ack,
)
from im_server.protocol.types import ConvRef, conv_ref


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


# -- commands: what the gateway must do for a received frame ---------------------------------
# (plain slotted dataclasses: a frozen one costs 0.25 µs more to build, on every frame)


@dataclass(slots=True)
class SendCmd:
    """Run the send pipeline; answer with :meth:`Session.acked` or :meth:`Session.refused`."""

    conv: ConvRef
    client_msg_id: str
    content_type: str
    content: dict[str, JsonValue]
    mentions: list[int] = field(default_factory=list)
    mention_all: bool = False
    reply_to: int | None = None

    @property
    def plain(self) -> bool:
        """No mention, no reply, no attachment: nothing to check before the script."""
        return (
            not self.mentions
            and not self.mention_all
            and self.reply_to is None
            and self.content_type not in ATTACHMENT_TYPES
        )


@dataclass(slots=True)
class CursorCmd:
    """Report a read or delivered cursor. No answer on success; a failure is answered
    with :meth:`Session.failed`."""

    kind: Literal["read", "delivered"]
    conv: ConvRef
    seq: int


@dataclass(slots=True)
class TypingCmd:
    """Relay a typing notice. No answer on success; a failure: :meth:`Session.failed`."""

    conv: ConvRef


@dataclass(slots=True)
class EditCmd:
    """Edit a message; answer with :meth:`Session.edited` or :meth:`Session.failed`."""

    conv: ConvRef
    seq: int
    content: dict[str, JsonValue]


@dataclass(slots=True)
class Reply:
    """Send ``text`` back at once: a pong, or the refusal of a bad frame. ``refused`` is
    the error code of a refusal (for the metrics), ``of_send`` tells a refused send (an
    ``ack``) from another refused frame (an ``error``)."""

    text: str
    refused: str | None = None
    of_send: bool = False


@dataclass(slots=True)
class Close:
    """Close the connection with this code and reason; nothing more is received."""

    code: CloseCode
    reason: str


Command = SendCmd | CursorCmd | TypingCmd | EditCmd | Reply | Close
PONG_REPLY = Reply(PONG)


class SessionClosed(RuntimeError):
    """A frame was fed to a session after it asked for the close."""


class Session:
    """The protocol state of one connection: who it is, its limits, open or closed."""

    __slots__ = ("user_id", "device_id", "max_frame_bytes", "state")

    def __init__(self, user_id: int, device_id: str, *, max_frame_bytes: int) -> None:
        self.user_id = user_id
        self.device_id = device_id
        self.max_frame_bytes = max_frame_bytes
        self.state = State.OPEN

    def receive(self, data: str | bytes) -> Command:
        """The command for one received frame (text or binary, both parsed as JSON)."""
        if self.state is not State.OPEN:
            raise SessionClosed("the session is closed")
        # characters of a text frame, bytes of a binary one: under im-server serve the
        # server enforces the byte limit itself before a frame gets here
        if len(data) > self.max_frame_bytes:
            return self.close(CloseCode.TOO_BIG, "frame too large")
        try:
            frame = parse_client_frame(data)
        except FrameError as e:
            if e.frame_type == "send":
                return Reply(encode(refused_ack(e.client_msg_id, e)), e.code, of_send=True)
            return Reply(encode(error_frame(e)), e.code)
        if isinstance(frame, SendFrame):
            return SendCmd(
                conv_ref(frame.conv_id),
                frame.client_msg_id,
                frame.content_type,
                frame.content,
                frame.mentions,
                frame.mention_all,
                frame.reply_to,
            )
        if isinstance(frame, ReadFrame):
            return CursorCmd("read", conv_ref(frame.conv_id), frame.seq)
        if isinstance(frame, PingFrame):
            return PONG_REPLY
        if isinstance(frame, TypingFrame):
            return TypingCmd(conv_ref(frame.conv_id))
        if isinstance(frame, EditFrame):
            return EditCmd(conv_ref(frame.conv_id), frame.seq, frame.content)
        return CursorCmd("delivered", conv_ref(frame.conv_id), frame.seq)

    def close(self, code: CloseCode, reason: str) -> Close:
        """Ask for the close (an oversize frame, a server bug, a shutdown)."""
        self.state = State.CLOSED
        return Close(code, reason)

    # -- results: the frames to send ------------------------------------------------------

    @staticmethod
    def acked(ack: AckOk) -> str:
        return encode(ack)

    @staticmethod
    def refused(client_msg_id: str, err: ImError) -> str:
        """A send refused after parsing (rights, size, rate, a store fault)."""
        return encode(refused_ack(client_msg_id, err))

    @staticmethod
    def edited(answer: Edited) -> str:
        return encode(answer)

    @staticmethod
    def failed(err: ImError) -> str:
        """A read, delivered, typing or edit command refused or failed."""
        return encode(error_frame(err))
