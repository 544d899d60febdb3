"""Client -> server frames: one model per frame type, a union tagged by ``type``, and
:func:`parse_client_frame`, which turns a received text (or binary) frame into one of them
or refuses it with a :class:`FrameError` whose message names the field at fault.

Unknown fields are ignored, never refused: a newer client may send optional fields this
server does not know yet, and must still be understood (forward compatibility)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from im_server.errors import ImError
from im_server.protocol.attachments import ATTACHMENT_TYPES, check_attachment_content
from im_server.protocol.json_ints import INT_RULE, oversized_int
from im_server.protocol.types import (
    ClientContentType,
    ClientMsgId,
    ConvId,
    Flag,
    JsonObject,
    Mentions,
    ReplyTo,
    ReportedSeq,
    Rule,
    Seq,
)

TEXT_RULE = "a text message needs content.text, a non-empty string"


def check_text_content(content_type: str, content: dict[str, JsonValue]) -> None:
    """The one rule that joins two fields: a ``text`` message has a non-empty ``text``."""
    if content_type == "text":
        text = content.get("text")
        if not isinstance(text, str) or not text:
            raise PydanticCustomError("bad_value", TEXT_RULE)


class ClientFrameModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SendFields(BaseModel):
    """What a send carries, over the WebSocket (``send`` frame) and over REST (``POST
    .../messages``, where the path names the conversation): one definition for both."""

    client_msg_id: ClientMsgId
    content_type: ClientContentType = "text"
    content: JsonObject
    mentions: Mentions = Field(
        default_factory=list,
        description="groups only: user ids to mention; those not members now are dropped",
    )
    mention_all: Flag = Field(False, description="groups only: mention everyone (owner, admins)")
    reply_to: ReplyTo | None = Field(
        None, description="the seq this message answers: one the sender can see here"
    )

    @property
    def plain(self) -> bool:
        """No mention, no reply, no attachment: the send needs no check beyond the
        script's."""
        return (
            not self.mentions
            and not self.mention_all
            and self.reply_to is None
            and self.content_type not in ATTACHMENT_TYPES
        )

    @property
    def attachment(self) -> bool:
        """A picture or file: the server checks the upload and writes the content."""
        return self.content_type in ATTACHMENT_TYPES

    @model_validator(mode="after")
    def _text_rule(self) -> Self:
        check_text_content(self.content_type, self.content)
        check_attachment_content(self.content_type, self.content)
        return self


class SendFrame(ClientFrameModel, SendFields):
    """Send a message; answered by an "ack" frame (ok or refused), never by an "error"."""

    type: Literal["send"]
    conv_id: ConvId


class ReadFrame(ClientFrameModel):
    """Report my read cursor (forward only, clamped to what I can see)."""

    type: Literal["read"]
    conv_id: ConvId
    seq: ReportedSeq


class DeliveredFrame(ClientFrameModel):
    """Report my delivered cursor (forward only, clamped like the read cursor)."""

    type: Literal["delivered"]
    conv_id: ConvId
    seq: ReportedSeq


class TypingFrame(ClientFrameModel):
    """I am typing in a conversation (relayed, not stored)."""

    type: Literal["typing"]
    conv_id: ConvId


class EditFrame(ClientFrameModel):
    """Edit my message: answered by an "edited" frame, or an "error" frame when refused."""

    type: Literal["edit"]
    conv_id: ConvId
    seq: Seq
    content: JsonObject


class PingFrame(ClientFrameModel):
    """Answered by a "pong" frame."""

    type: Literal["ping"]


ClientFrame = Annotated[
    SendFrame | ReadFrame | DeliveredFrame | TypingFrame | PingFrame | EditFrame,
    Field(discriminator="type"),
]
CLIENT_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
MODELS: dict[str, type[ClientFrameModel]] = {
    "send": SendFrame,
    "read": ReadFrame,
    "delivered": DeliveredFrame,
    "typing": TypingFrame,
    "ping": PingFrame,
    "edit": EditFrame,
}
CLIENT_TYPES = frozenset(MODELS)
_validate = CLIENT_FRAME.validator.validate_python
"""The union's pydantic-core validator itself: ``TypeAdapter.validate_python`` adds
0.25 µs of Python around it, per frame."""


class FrameError(ImError):
    """A refused frame (``bad_request``). It keeps the frame's ``type`` and its
    ``client_msg_id`` as sent (anything, or None), so that a refused ``send`` can be
    answered by an ``ack`` that echoes them."""

    def __init__(
        self, message: str, frame_type: str | None = None, client_msg_id: object = None
    ) -> None:
        super().__init__("bad_request", message)
        self.frame_type = frame_type
        self.client_msg_id = client_msg_id


def parse_client_frame(data: str | bytes) -> ClientFrame:
    """One received frame, checked: a model from the :data:`ClientFrame` union, or a
    :class:`FrameError`. JSON is read by orjson: strict RFC 8259 (no ``NaN``, no lone
    surrogates); every integer, content included, within the signed 64-bit range
    (``protocol/json_ints.py``)."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise FrameError("a frame must be one JSON object") from None
    if not isinstance(raw, dict):
        raise FrameError("a frame must be one JSON object")
    ftype = raw.get("type")
    if not isinstance(ftype, str):
        raise FrameError("a frame needs a string 'type'")
    if ftype not in CLIENT_TYPES:
        raise FrameError(f"unknown frame type {ftype[:32]!r}")
    if (big := oversized_int(data)) is not None:
        raise FrameError(f"{INT_RULE}: {big}", ftype, raw.get("client_msg_id"))
    try:
        frame: ClientFrame = _validate(raw)
    except ValidationError as e:
        raise FrameError(explain(e, MODELS[ftype]), ftype, raw.get("client_msg_id")) from None
    return frame


FIELD_ORDER = (
    "conv_id",
    "client_msg_id",
    "content_type",
    "content",
    "mentions",
    "mention_all",
    "reply_to",
    "seq",
)
"""The order in which a frame's fields are reported: where the conversation is, then what
is sent (a send's own fields come from :class:`SendFields`, declared before ``conv_id``)."""


def _field_rank(loc: list[str]) -> int:
    name = loc[0] if loc else ""
    return FIELD_ORDER.index(name) if name in FIELD_ORDER else len(FIELD_ORDER)


def explain(exc: ValidationError, model: type[BaseModel]) -> str:
    """The first error of a frame, in :data:`FIELD_ORDER`, as one sentence that names the
    field: ``"seq must be a non-negative integer"``."""
    errors = []
    for e in exc.errors(include_url=False, include_input=False):
        loc = [str(p) for p in e["loc"]]
        if loc and loc[0] in CLIENT_TYPES:  # the tagged union puts the tag first
            loc = loc[1:]
        errors.append((_field_rank(loc), loc, e))
    _, loc, err = min(errors, key=lambda x: x[0])
    if not loc:
        return err["msg"]  # a rule over several fields: its message says it all
    name = ".".join(loc)
    if err["type"] == "missing":
        rule = _rule_of(model, loc[0])
        return f"{name} is required" + (f" and {rule}" if rule else "")
    if err["type"] == "bad_value":
        return f"{name} {err['msg']}"
    return f"{name}: {err['msg']}"


def _rule_of(model: type[BaseModel], field: str) -> str | None:
    info = model.model_fields.get(field)
    if info is None:
        return None
    return next((m.text for m in info.metadata if isinstance(m, Rule)), None)
