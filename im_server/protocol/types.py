"""The named, bounded types of the wire contract, shared by WebSocket frames and REST bodies.

Each type is a pydantic ``Annotated`` type, strict (a JSON ``true`` is not an integer, nor
is ``1.0``), carrying a :class:`Rule`: the one sentence a client gets when a value breaks
it, also shown as the field's description in the JSON Schema and the OpenAPI document.

The conversation id rule (:func:`conv_ref`) lives here too, so ``ids.parse_conv_id``, the
frame models and the REST paths all apply the same one."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Annotated, Literal

import emoji
from pydantic import (
    AfterValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    PlainSerializer,
    PlainValidator,
    Strict,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

MAX_INT64 = 2**63 - 1
"""The largest id or seq: PostgreSQL ``bigint`` and Redis integers are signed 64-bit."""


@dataclass(frozen=True, slots=True)
class Rule:
    """A type's rule as one sentence (``"must be ..."``): any failure of the type's checks
    is reported with it instead of pydantic's wording, and it becomes the description in
    the JSON Schema. Applied in pydantic-core, so a valid value pays nothing for it."""

    text: str

    def __get_pydantic_core_schema__(
        self, source: object, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.custom_error_schema(
            handler(source), custom_error_type="bad_value", custom_error_message=self.text
        )

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out.setdefault("description", self.text)
        return out


# -- integers -------------------------------------------------------------------------------

UserId = Annotated[
    int, Strict(), Field(ge=1, le=MAX_INT64), Rule("must be a positive 64-bit integer")
]
GroupId = Annotated[
    int, Strict(), Field(ge=1, le=MAX_INT64), Rule("must be a positive 64-bit integer")
]
RequestId = Annotated[
    int, Strict(), Field(ge=1, le=MAX_INT64), Rule("must be a positive 64-bit integer")
]
Seq = Annotated[
    int, Strict(), Field(ge=0, le=MAX_INT64), Rule("must be a non-negative 64-bit integer")
]
"""A seq as the server states it (0 where none yet, as in an empty window's edge)."""


def _clamp(value: int) -> int:
    return min(value, MAX_INT64)


ReportedSeq = Annotated[
    int, Strict(), Field(ge=0), AfterValidator(_clamp), Rule("must be a non-negative integer")
]
"""A read or delivered seq reported by a client: above 2^63-1 it is lowered to it (the
cursor is clamped to what exists anyway), never refused."""


MAX_MENTIONS = 100
"""The most entries a send's ``mentions`` list may hold (duplicates count)."""
Mentions = Annotated[
    list[UserId],
    Field(max_length=MAX_MENTIONS),
    Rule(f"must be a list of at most {MAX_MENTIONS} positive 64-bit user ids"),
]
ReplyTo = Annotated[int, Strict(), Field(ge=1, le=MAX_INT64), Rule("must be a positive 64-bit seq")]
"""The seq a message answers (the server checks that the sender can see it)."""
Flag = Annotated[bool, Strict(), Rule("must be true or false")]

Count = Annotated[int, Strict(), Field(ge=0), Rule("must be a non-negative integer")]
Timestamp = Annotated[int, Strict(), Field(ge=0), Rule("must be milliseconds since the Unix epoch")]
Version = Annotated[int, Strict(), Field(ge=0), Rule("must be a non-negative integer")]

# -- strings --------------------------------------------------------------------------------

CLIENT_MSG_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
ClientMsgId = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=CLIENT_MSG_ID_PATTERN),
    Rule("must be 1-64 characters of [A-Za-z0-9_-]"),
]
_CMID = re.compile(CLIENT_MSG_ID_PATTERN)

CONTENT_TYPE_PATTERN = r"^[a-z][a-z0-9_.-]{0,31}$"
SERVER_CONTENT_TYPES = frozenset({"system", "recall", "edit", "reaction"})
"""Notices: made by the server only, never counted as unread, never edited or reacted to."""
ContentType = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=CONTENT_TYPE_PATTERN),
    Rule("must be a lowercase word like 'text' (1-32 of [a-z0-9_.-])"),
]


def _not_server_made(value: str) -> str:
    if value in SERVER_CONTENT_TYPES:
        raise ValueError("made by the server only")
    return value


ClientContentType = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=CONTENT_TYPE_PATTERN),
    AfterValidator(_not_server_made),
    Rule(
        "must be a lowercase word like 'text' ('system', 'recall', 'edit' and 'reaction' "
        "are the server's)"
    ),
]

ErrorCode = Annotated[
    str,
    Field(
        description="one of the contract's error codes (bad_request, not_member, "
        "not_friends, blocked, too_large, rate_limited, forbidden, unavailable...); "
        "clients must accept codes they do not know"
    ),
]
Role = Literal["owner", "admin", "member"]

# -- JSON objects ---------------------------------------------------------------------------


def _json_object(value: object) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise PydanticCustomError("bad_value", "must be a JSON object")
    return value


def _as_is(value: dict[str, JsonValue]) -> object:
    return value


JsonObject = Annotated[
    dict[str, JsonValue],
    PlainValidator(_json_object),
    PlainSerializer(_as_is),  # (else pydantic lists an unused JsonValue in OpenAPI documents)
    WithJsonSchema({"type": "object"}),
    Rule("must be a JSON object"),
]
"""Message content. Only its top level is checked: it was just parsed from JSON (a frame,
a request body) or read from ``jsonb``, so its values are JSON values already, and a
deep check would cost ~20 µs per KiB on the send path."""

# -- conversation ids -----------------------------------------------------------------------

_SINGLE = re.compile(r"s:([1-9][0-9]{0,18}):([1-9][0-9]{0,18})")
_GROUP = re.compile(r"g:([1-9][0-9]{0,18})")
CONV_ID_RULE = "must be 's:<a>:<b>' with a < b or 'g:<group_id>'"


@dataclass(frozen=True, slots=True)
class ConvRef:
    """A checked conversation id, taken apart."""

    conv_id: str
    kind: Literal["single", "group"]
    a: int = 0  # single: the smaller user id
    b: int = 0  # single: the larger user id
    group_id: int = 0

    def peer_of(self, user_id: int) -> int:
        return self.b if user_id == self.a else self.a

    def has_user(self, user_id: int) -> bool:
        return self.kind == "single" and user_id in (self.a, self.b)


@functools.lru_cache(maxsize=8192)
def conv_ref(conv_id: str) -> ConvRef:
    """THE conversation id rule: ``s:<a>:<b>`` with 0 < a < b <= 2^63-1, or
    ``g:<group_id>`` with 0 < group_id <= 2^63-1, ASCII digits without leading zeros.
    Raises ``ValueError`` for anything else. Cached: the same few ids come back on every
    send of a busy connection (a miss is ~1 µs, a hit ~0.05 µs)."""
    if len(conv_id) <= 45:
        m = _SINGLE.fullmatch(conv_id)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if a < b <= MAX_INT64:
                return ConvRef(conv_id, "single", a=a, b=b)
        m = _GROUP.fullmatch(conv_id)
        if m and int(m.group(1)) <= MAX_INT64:
            return ConvRef(conv_id, "group", group_id=int(m.group(1)))
    raise ValueError(f"conv_id {CONV_ID_RULE}")


def _check_conv_id(value: str) -> str:
    conv_ref(value)
    return value


EXTERNAL_ID_PATTERN = r"^[A-Za-z0-9_.@:-]{1,128}$"
ExternalId = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=EXTERNAL_ID_PATTERN),
    Rule("must be 1-128 characters of [A-Za-z0-9_.@:-] (the app's id of the user)"),
]
ConvId = Annotated[
    str,
    Strict(),
    StringConstraints(
        max_length=45,
        pattern=r"^(s:[1-9][0-9]{0,18}:[1-9][0-9]{0,18}|g:[1-9][0-9]{0,18})$",
    ),
    AfterValidator(_check_conv_id),
    Rule(CONV_ID_RULE),
]


def valid_client_msg_id(value: object) -> bool:
    return isinstance(value, str) and _CMID.fullmatch(value) is not None


# -- reactions ------------------------------------------------------------------------------

EMOJI_MAX_CHARS = 32
EMOJI_RULE = (
    "must be one fully-qualified Unicode emoji (one picture: a ZWJ sequence, a skin tone, "
    "a flag or a keycap included), e.g. 👍 or ❤️ (not the bare ❤)"
)


def valid_emoji(value: object) -> bool:
    """THE reaction rule: exactly one emoji that Unicode lists as fully qualified
    (``emoji-test.txt``, as shipped by the ``emoji`` package), at most 32 code points.
    Fully qualified only, so each picture has one spelling: "❤️" is a reaction, the bare
    "❤" (U+2764 without its variation selector) is refused rather than counted apart.
    Free text, several emojis, a skin tone alone, control characters, a broken encoding
    (U+FFFD) are all refused."""
    if not isinstance(value, str) or not 1 <= len(value) <= EMOJI_MAX_CHARS:
        return False
    data = emoji.EMOJI_DATA.get(value)
    return data is not None and data["status"] == emoji.STATUS["fully_qualified"]
