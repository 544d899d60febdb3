"""Server -> client frames: one typed model per frame, a union tagged by ``type``, and one
builder per frame.

The models are ``TypedDict``s: a frame is built on the hot path (an ack and a ``message``
per send), and a dict literal costs nothing over the untyped dict it replaces, where a
pydantic ``BaseModel`` would cost ~8 µs per send to construct and serialize. mypy checks
every builder against its model; pydantic reads the same classes for the JSON Schema
(extra fields forbidden, so the schema is exact) and for the REST response models.

``message_frame`` splices the already-encoded content into the frame instead of parsing
and re-encoding it; ``tests/unit/test_protocol_frames.py`` proves the result equals the
model's JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final, Literal

import orjson
from pydantic import ConfigDict, Field, JsonValue, StringConstraints, TypeAdapter, with_config
from typing_extensions import TypedDict

from im_server.errors import ImError
from im_server.protocol.types import (
    ClientMsgId,
    ContentType,
    ConvId,
    Count,
    ErrorCode,
    JsonObject,
    Seq,
    Timestamp,
    UserId,
)

_EXACT = ConfigDict(extra="forbid")


@with_config(_EXACT)
class Reaction(TypedDict):
    """One emoji on a message: how many members put it there, and whether the reader did."""

    emoji: str
    count: Count
    mine: bool


@with_config(_EXACT)
class Message(TypedDict):
    """A message, as pushed and as read from history. A recalled one keeps its seq and
    loses its content ("content": null, "recalled": true). An edited one reads with its
    newest content and "edited_at" (ms); "reactions" are counted for the reader (a new
    message's push has "edited_at": null, "reactions": [])."""

    conv_id: ConvId
    seq: Seq
    sender_id: UserId
    client_msg_id: ClientMsgId
    content_type: ContentType
    content: JsonObject | None
    server_time: Timestamp
    recalled: bool
    mentions: list[UserId]
    mention_all: bool
    reply_to: Seq | None
    edited_at: Timestamp | None
    reactions: list[Reaction]


@with_config(_EXACT)
class AckOk(TypedDict):
    """A send accepted: the message has its seq and sits in the durable queue."""

    type: Literal["ack"]
    client_msg_id: ClientMsgId
    ok: Literal[True]
    conv_id: ConvId
    seq: Seq
    server_time: Timestamp
    duplicate: bool


@with_config(_EXACT)
class AckRefused(TypedDict):
    """A send refused; "client_msg_id" echoes the frame's when it is a string of at
    most 128 characters, else null."""

    type: Literal["ack"]
    client_msg_id: Annotated[str, StringConstraints(max_length=128)] | None
    ok: Literal[False]
    code: ErrorCode
    message: str


@with_config(_EXACT)
class MessagePush(TypedDict):
    """A new message (to every device of every member but the sending socket)."""

    type: Literal["message"]
    message: Message


@with_config(_EXACT)
class ReadPush(TypedDict):
    """A read cursor moved: mine on another device, or the peer's in a single chat."""

    type: Literal["read"]
    conv_id: ConvId
    user_id: UserId
    seq: Seq


@with_config(_EXACT)
class DeliveredPush(TypedDict):
    """The peer's delivered cursor moved (single chats)."""

    type: Literal["delivered"]
    conv_id: ConvId
    user_id: UserId
    seq: Seq


@with_config(_EXACT)
class ReceiptPush(TypedDict):
    """Group read progress of one of my messages (batched, about once a second)."""

    type: Literal["receipt"]
    conv_id: ConvId
    seq: Seq
    read_count: Count


@with_config(_EXACT)
class TypingPush(TypedDict):
    """Another member is typing."""

    type: Literal["typing"]
    conv_id: ConvId
    user_id: UserId


@with_config(_EXACT)
class PresencePush(TypedDict):
    """A friend's first connection opened (online) or last one closed (offline; an
    offline is announced only after the friend stayed away for a grace period)."""

    type: Literal["presence"]
    user_id: UserId
    online: bool
    last_seen: Timestamp | None


@with_config(_EXACT)
class ContactsPush(TypedDict):
    """My friends or my pending friend requests changed (a request came, was accepted,
    declined or cancelled; a friend was added, removed or blocked): read GET /v1/friends
    and GET /v1/friends/requests again. It carries nothing else, so it says nothing a
    read of those lists would not."""

    type: Literal["contacts"]


@with_config(_EXACT)
class ErrorFrame(TypedDict):
    """A frame other than "send" was refused, or failed."""

    type: Literal["error"]
    code: ErrorCode
    message: str


@with_config(_EXACT)
class Edited(TypedDict):
    """An edit accepted (the answer to an "edit" frame, and of the REST call): the seq
    and time of the edit notice that set the message's content; an edit to the content
    the message already has answers the current ones (null for a message never edited)."""

    type: Literal["edited"]
    conv_id: ConvId
    seq: Seq
    edit_seq: Seq | None
    edited_at: Timestamp | None


@with_config(_EXACT)
class Pong(TypedDict):
    """The answer to "ping"."""

    type: Literal["pong"]


Ack = Annotated[AckOk | AckRefused, Field(discriminator="ok")]
ServerFrame = Annotated[
    Ack
    | MessagePush
    | ReadPush
    | DeliveredPush
    | ReceiptPush
    | TypingPush
    | PresencePush
    | ContactsPush
    | ErrorFrame
    | Pong
    | Edited,
    Field(discriminator="type"),
]
SERVER_FRAME: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)
AnyServerFrame = (
    AckOk
    | AckRefused
    | MessagePush
    | ReadPush
    | DeliveredPush
    | ReceiptPush
    | TypingPush
    | PresencePush
    | ContactsPush
    | ErrorFrame
    | Pong
    | Edited
)

PONG: Final = '{"type":"pong"}'


def encode(frame: AnyServerFrame) -> str:
    """A frame as the text of a WebSocket message (compact JSON, UTF-8)."""
    return orjson.dumps(frame).decode()


def ack(conv_id: str, client_msg_id: str, seq: int, server_time: int, duplicate: bool) -> AckOk:
    return {
        "type": "ack",
        "client_msg_id": client_msg_id,
        "ok": True,
        "conv_id": conv_id,
        "seq": seq,
        "server_time": server_time,
        "duplicate": duplicate,
    }


def refused_ack(client_msg_id: object, err: ImError) -> AckRefused:
    """The refusal of a send; the id is echoed only when it is a short string (it may be
    anything a client sent)."""
    cmid = client_msg_id if isinstance(client_msg_id, str) and len(client_msg_id) <= 128 else None
    return {
        "type": "ack",
        "client_msg_id": cmid,
        "ok": False,
        "code": err.code,
        "message": err.message,
    }


def error_frame(err: ImError) -> ErrorFrame:
    return {"type": "error", "code": err.code, "message": err.message}


def message_push(
    conv_id: str,
    seq: int,
    sender_id: int,
    client_msg_id: str,
    content_type: str,
    content: dict[str, JsonValue] | None,
    server_time: int,
    *,
    mentions: Sequence[int] = (),
    mention_all: bool = False,
    reply_to: int | None = None,
) -> MessagePush:
    """The ``message`` frame as a model (content parsed); what :func:`message_frame`
    produces as text without parsing the content."""
    return {
        "type": "message",
        "message": {
            "conv_id": conv_id,
            "seq": seq,
            "sender_id": sender_id,
            "client_msg_id": client_msg_id,
            "content_type": content_type,
            "content": content,
            "server_time": server_time,
            "recalled": False,
            "mentions": list(mentions),
            "mention_all": mention_all,
            "reply_to": reply_to,
            "edited_at": None,
            "reactions": [],
        },
    }


def message_frame(
    conv_id: str,
    seq: int,
    sender_id: int,
    client_msg_id: str,
    content_type: str,
    content_json: str,
    server_time: int,
    *,
    mentions: Sequence[int] = (),
    mention_all: bool = False,
    reply_to: int | None = None,
) -> str:
    """The ``message`` frame as text, built once per message and sent to every device.
    ``content_json`` is the content as the send pipeline encoded it (compact JSON of an
    object), spliced in rather than parsed and encoded again. The key order is the
    model's, so the text equals ``encode(message_push(...))``."""
    head = orjson.dumps(
        {
            "conv_id": conv_id,
            "seq": seq,
            "sender_id": sender_id,
            "client_msg_id": client_msg_id,
            "content_type": content_type,
        }
    ).decode()
    if not mentions and not mention_all and reply_to is None:
        tail = _PLAIN_TAIL
    else:
        ids = ",".join(str(u) for u in mentions)
        tail = (
            f',"mentions":[{ids}],"mention_all":{"true" if mention_all else "false"},'
            f'"reply_to":{"null" if reply_to is None else reply_to}'
            ',"edited_at":null,"reactions":[]}}'
        )
    return (
        '{"type":"message","message":'
        + head[:-1]
        + ',"content":'
        + content_json
        + f',"server_time":{server_time},"recalled":false'
        + tail
    )


_PLAIN_TAIL = ',"mentions":[],"mention_all":false,"reply_to":null,"edited_at":null,"reactions":[]}}'
"""The end of a new ``message`` frame that mentions nobody and answers nothing."""


def cursor_push(
    kind: Literal["read", "delivered"], conv_id: str, user_id: int, seq: int
) -> ReadPush | DeliveredPush:
    if kind == "read":
        return {"type": "read", "conv_id": conv_id, "user_id": user_id, "seq": seq}
    return {"type": "delivered", "conv_id": conv_id, "user_id": user_id, "seq": seq}


def receipt_push(conv_id: str, seq: int, read_count: int) -> ReceiptPush:
    return {"type": "receipt", "conv_id": conv_id, "seq": seq, "read_count": read_count}


def typing_push(conv_id: str, user_id: int) -> TypingPush:
    return {"type": "typing", "conv_id": conv_id, "user_id": user_id}


def presence_push(user_id: int, online: bool, last_seen: int | None) -> PresencePush:
    return {"type": "presence", "user_id": user_id, "online": online, "last_seen": last_seen}


CONTACTS: Final = '{"type":"contacts"}'


def edited(conv_id: str, seq: int, edit_seq: int | None, edited_at: int | None) -> Edited:
    return {
        "type": "edited",
        "conv_id": conv_id,
        "seq": seq,
        "edit_seq": edit_seq,
        "edited_at": edited_at,
    }
