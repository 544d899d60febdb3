"""Conversation ids: ``s:<a>:<b>`` (a < b) for single chats, ``g:<group_id>`` for groups.

The rule itself lives with the other wire types (``types.py``, :func:`conv_ref`); this
module builds ids and turns a bad one into a ``bad_request``."""

from __future__ import annotations

from im_server.errors import bad_request
from im_server.protocol.types import CONV_ID_RULE, MAX_INT64, ConvRef, conv_ref
from im_server.protocol.types import valid_client_msg_id as valid_client_msg_id

MAX_ID = MAX_INT64

__all__ = [
    "MAX_ID",
    "ConvRef",
    "group_conv_id",
    "parse_conv_id",
    "single_conv_id",
    "valid_client_msg_id",
]


def single_conv_id(u1: int, u2: int) -> str:
    a, b = sorted((u1, u2))
    return f"s:{a}:{b}"


def group_conv_id(group_id: int) -> str:
    return f"g:{group_id}"


def parse_conv_id(conv_id: object) -> ConvRef:
    """Parse and validate; any other shape is a ``bad_request``."""
    if not isinstance(conv_id, str):
        raise bad_request(f"conv_id {CONV_ID_RULE}")
    try:
        return conv_ref(conv_id)
    except ValueError:
        raise bad_request(f"conv_id {CONV_ID_RULE}") from None
