"""Conversation ids: ``s:<a>:<b>`` (a < b) for single chats, ``g:<group_id>`` for groups."""

from __future__ import annotations

import re
from dataclasses import dataclass

from im_server.errors import bad_request

_SINGLE = re.compile(r"^s:([1-9][0-9]{0,18}):([1-9][0-9]{0,18})$")
_GROUP = re.compile(r"^g:([1-9][0-9]{0,18})$")
_CMID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConvRef:
    conv_id: str
    kind: str  # "single" | "group"
    a: int = 0  # single: the smaller user id
    b: int = 0  # single: the larger user id
    group_id: int = 0

    def peer_of(self, user_id: int) -> int:
        return self.b if user_id == self.a else self.a

    def has_user(self, user_id: int) -> bool:
        return self.kind == "single" and user_id in (self.a, self.b)


def single_conv_id(u1: int, u2: int) -> str:
    a, b = sorted((u1, u2))
    return f"s:{a}:{b}"


def group_conv_id(group_id: int) -> str:
    return f"g:{group_id}"


def parse_conv_id(conv_id: object) -> ConvRef:
    """Parse and validate; any other shape is a ``bad_request``."""
    if not isinstance(conv_id, str) or len(conv_id) > 45:
        raise bad_request("conv_id must be 's:<a>:<b>' with a < b or 'g:<group_id>'")
    m = _SINGLE.fullmatch(conv_id)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if a < b <= MAX_ID:
            return ConvRef(conv_id, "single", a=a, b=b)
    m = _GROUP.fullmatch(conv_id)
    if m and int(m.group(1)) <= MAX_ID:
        return ConvRef(conv_id, "group", group_id=int(m.group(1)))
    raise bad_request("conv_id must be 's:<a>:<b>' with a < b or 'g:<group_id>'")


def valid_client_msg_id(value: object) -> bool:
    return isinstance(value, str) and _CMID.fullmatch(value) is not None
