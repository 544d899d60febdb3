"""History by seq range, clamped to the caller's visibility window (the seed rules):
lower bound max(conversation min, my min), upper bound min(conversation max, my max);
a range wholly outside answers an empty list; past ``limit`` the seqs nearest ``end``
are kept; ``is_end`` mirrors the order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from im_server.context import Context
from im_server.errors import ImError, not_found
from im_server.protocol.ids import ConvRef
from im_server.protocol.types import MAX_INT64
from im_server.storage import conversations, memberships, messages, reactions
from im_server.storage.conversations import ConvRow, MemberRow

INF = MAX_INT64  # an open window end


@dataclass(frozen=True, slots=True)
class Window:
    lo: int
    hi: int  # may be lo - 1: nothing visible


def window(conv: ConvRow, m: MemberRow) -> Window:
    lo = max(conv.min_seq, m.min_seq)
    hi = min(conv.max_seq, m.max_seq if m.max_seq is not None else INF)
    return Window(lo, max(hi, lo - 1))


def plan(
    win: Window, begin: int | None, end: int | None, limit: int, descending: bool
) -> tuple[int, int, bool]:
    """Pure: the seq range to fetch (b > e means nothing) and is_end."""
    req_begin = win.lo if begin is None else begin
    req_end = win.hi if end is None else end
    b, e = max(req_begin, win.lo), min(req_end, win.hi)
    if e - b + 1 > limit:
        b = e - limit + 1
    if descending:
        is_end = (b <= win.lo) if b <= e else (req_begin <= win.lo)
    else:
        is_end = req_end >= win.hi
    return b, e, is_end


async def load_member(conn: Any, ref: ConvRef, user_id: int) -> tuple[ConvRow, MemberRow]:
    conv = await conversations.conv_row(conn, ref.conv_id)
    m = await memberships.member(conn, ref.conv_id, user_id) if conv else None
    if conv is None or m is None:
        if ref.kind == "single" and ref.has_user(user_id):
            raise not_found("no such conversation (you are not friends yet)")
        if conv is None and ref.kind == "group":
            raise not_found("no such conversation")
        raise ImError("not_member", "you are not a member of this conversation")
    return conv, m


async def get_history(
    ctx: Context,
    user_id: int,
    ref: ConvRef,
    begin: int | None,
    end: int | None,
    limit: int,
    order: str,
) -> dict[str, Any]:
    descending = order == "desc"
    async with ctx.db.connect() as conn:
        conv, m = await load_member(conn, ref, user_id)
        win = window(conv, m)
        b, e, is_end = plan(win, begin, end, limit, descending)
        msgs = await messages.message_range(conn, ref.conv_id, b, e, descending) if b <= e else []
        await reactions.attach(conn, user_id, msgs)
    return {"messages": msgs, "min_seq": win.lo, "max_seq": win.hi, "is_end": is_end}
