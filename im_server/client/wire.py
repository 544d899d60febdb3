"""What the client puts on the wire besides frames it is given: conversation ids and
paths, and the body of a send (shared by the WebSocket ``send`` and REST)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

JsonObject = dict[str, Any]
"""A decoded JSON object as the server sent it (a WebSocket frame, a REST answer). The
client hands it on unvalidated: tests must see exactly what the server said, malformed or
not, so it is not parsed into the server's frame models."""


def single_conv_id(a: int, b: int) -> str:
    """The single-chat conv_id, which clients may compute themselves: ``s:<lo>:<hi>``."""
    lo, hi = sorted((int(a), int(b)))
    return f"s:{lo}:{hi}"


def group_conv_id(group_id: int) -> str:
    return f"g:{int(group_id)}"


def conv_path(conv_id: str) -> str:
    """The REST path of a conversation (its ``:`` left as is)."""
    return "/v1/conversations/" + quote(conv_id, safe=":")


def _content(content: Any) -> Any:
    """A bare string is shorthand for a text body ``{"text": ...}``; anything else is
    sent as given, so that tests can still send malformed content on purpose."""
    return {"text": content} if isinstance(content, str) else content


def send_body(
    conv_id: str,
    content: Any,
    content_type: str,
    client_msg_id: str | None,
    *,
    mentions: list[int] | None = None,
    mention_all: bool = False,
    reply_to: int | None = None,
) -> JsonObject:
    """The fields of a send; a new ``client_msg_id`` when none is given. ``mentions``,
    ``mention_all`` and ``reply_to`` are sent only when given."""
    body: JsonObject = {
        "client_msg_id": client_msg_id or uuid.uuid4().hex,
        "conv_id": conv_id,
        "content_type": content_type,
        "content": _content(content),
    }
    if mentions is not None:
        body["mentions"] = list(mentions)
    if mention_all:
        body["mention_all"] = True
    if reply_to is not None:
        body["reply_to"] = reply_to
    return body
