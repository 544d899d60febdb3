"""What the Lua scripts answer, as types. Redis hands back nested lists of strings and
integers; they are checked and turned into these small values here, at the storage
boundary, so the services match on types and never index into a raw reply. A reply
that breaks a script's contract raises ``ScriptReplyError``: Lua and Python disagree,
which is a bug, not a store failure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeAlias

RefusalCode = Literal["not_friends", "blocked", "not_member", "muted"]
REFUSAL_CODES: frozenset[str] = frozenset({"not_friends", "blocked", "not_member", "muted"})


class ScriptReplyError(ValueError):
    """A script's reply does not have the shape its contract promises."""


@dataclass(frozen=True, slots=True)
class SendOk:
    """Queued on the stream with this seq; ``refill``: the seq block runs short, top it
    up in the background."""

    seq: int
    server_time: int
    refill: bool


@dataclass(frozen=True, slots=True)
class SendDuplicate:
    """A repeat of an earlier send: the original's place."""

    conv_id: str
    seq: int
    server_time: int


@dataclass(frozen=True, slots=True)
class SendRefused:
    code: RefusalCode


@dataclass(frozen=True, slots=True)
class SendNeedsPermissions:
    """The conversation's permission cache is cold: load it (as of ``epoch``), then retry."""

    epoch: str


@dataclass(frozen=True, slots=True)
class SendNeedsSeqBlock:
    """No seq left in Redis: reserve a block in PostgreSQL, then retry."""


@dataclass(frozen=True, slots=True)
class SendRedisReset:
    """This Redis lost its data (no boot marker): check its epoch, then retry."""


@dataclass(frozen=True, slots=True)
class SendCheckDedupe:
    """The dedupe key may have been lost with Redis's data: ask PostgreSQL, then retry."""


SendResult: TypeAlias = (
    SendOk
    | SendDuplicate
    | SendRefused
    | SendNeedsPermissions
    | SendNeedsSeqBlock
    | SendRedisReset
    | SendCheckDedupe
)

NEEDS_SEQ_BLOCK = SendNeedsSeqBlock()
REDIS_RESET = SendRedisReset()
CHECK_DEDUPE = SendCheckDedupe()
_BARE: dict[str, SendResult] = {
    "need_block": NEEDS_SEQ_BLOCK,
    "reset": REDIS_RESET,
    "check_pg": CHECK_DEDUPE,
}


def parse_send(raw: object) -> SendResult:
    """One entry of ``send_batch.lua``'s reply (see the script's header)."""
    if not isinstance(raw, list) or not raw:
        raise ScriptReplyError(f"send script: expected a non-empty list, got {raw!r:.200}")
    status, n = raw[0], len(raw)
    try:
        if status == "ok" and n == 4:
            return SendOk(int(raw[1]), int(raw[2]), int(raw[3]) == 1)
        if status == "dup" and n == 2:
            return parse_dedupe_value(raw[1])
        if status == "denied" and n == 2 and raw[1] in REFUSAL_CODES:
            return SendRefused(raw[1])
        if status == "perm_cold" and n == 2 and isinstance(raw[1], str):
            return SendNeedsPermissions(raw[1])
        if n == 1 and isinstance(status, str) and status in _BARE:
            return _BARE[status]
    except (TypeError, ValueError) as e:
        raise ScriptReplyError(f"send script: bad values in {raw!r:.200}") from e
    raise ScriptReplyError(f"send script: unexpected answer {raw!r:.200}")


def dedupe_value(conv_id: str, seq: int, server_time: int) -> str:
    """The value of a dedupe key (``send_batch.lua`` writes the same shape)."""
    return f"{conv_id}|{seq}|{server_time}"


def parse_dedupe_value(value: object) -> SendDuplicate:
    if not isinstance(value, str):
        raise ScriptReplyError(f"dedupe value: expected text, got {value!r:.200}")
    parts = value.split("|")
    if len(parts) != 3 or not parts[0]:
        raise ScriptReplyError(f"dedupe value: expected conv|seq|server_time, got {value!r:.200}")
    try:
        return SendDuplicate(parts[0], int(parts[1]), int(parts[2]))
    except ValueError as e:
        raise ScriptReplyError(f"dedupe value: bad numbers in {value!r:.200}") from e


def parse_int_pair(raw: object, script: str) -> tuple[int, int]:
    """A ``{a, b}`` reply of integers (``extend_seq.lua``: cur, lim)."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise ScriptReplyError(f"{script}: expected two integers, got {raw!r:.200}")
    try:
        return int(raw[0]), int(raw[1])
    except (TypeError, ValueError) as e:
        raise ScriptReplyError(f"{script}: expected two integers, got {raw!r:.200}") from e


def parse_flag(raw: object, script: str) -> bool:
    """A 0/1 reply (``lease.lua``, ``load_perm.lua``, ``attempt_take.lua``)."""
    if raw == 1 or raw == 0:
        return raw == 1
    raise ScriptReplyError(f"{script}: expected 0 or 1, got {raw!r:.200}")


def parse_user_ids(raw: object, script: str) -> list[int]:
    """A list of user ids (``presence_set.lua``)."""
    if not isinstance(raw, list):
        raise ScriptReplyError(f"{script}: expected a list of user ids, got {raw!r:.200}")
    try:
        return [int(x) for x in raw]
    except (TypeError, ValueError) as e:
        raise ScriptReplyError(f"{script}: expected user ids, got {raw!r:.200}") from e


def parse_offlines(raw: object) -> list[tuple[int, int]]:
    """``presence_sweep.lua``'s flat {user_id, last_seen, ...}."""
    if not isinstance(raw, list) or len(raw) % 2:
        raise ScriptReplyError(f"presence_sweep: expected pairs, got {raw!r:.200}")
    try:
        return [(int(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), 2)]
    except (TypeError, ValueError) as e:
        raise ScriptReplyError(f"presence_sweep: expected integers, got {raw!r:.200}") from e


def join_devices(devices: Iterable[str]) -> str:
    """A node's entry in a user's devices hash: the device ids, sorted, joined by spaces
    (a device id never holds one); "" for none."""
    return " ".join(sorted(devices))


def parse_live_devices(raw: object, live: set[str]) -> set[str]:
    """A user's devices hash (``HGETALL``: node -> devices joined by spaces) read down to
    the devices with an open socket on a live node; a dead node's entry is skipped (the
    sweep removes it later)."""
    if not isinstance(raw, dict):
        raise ScriptReplyError(f"presence devices: expected a hash, got {raw!r:.200}")
    out: set[str] = set()
    for node, devices in raw.items():
        if node in live:
            if not isinstance(devices, str):
                raise ScriptReplyError(f"presence devices: expected text, got {devices!r:.200}")
            out.update(devices.split())
    return out
