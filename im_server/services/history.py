"""History by seq range, clamped to the caller's visibility window (the seed rules):
lower bound max(conversation min, my min), upper bound min(conversation max, my max);
a range wholly outside answers an empty list; past ``limit`` the seqs nearest ``end``
are kept; ``is_end`` mirrors the order."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from im_server.context import Context
from im_server.errors import ImError, not_found
from im_server.ids import ConvRef
from im_server.services import send, seqs
from im_server.storage import conversations, messages
from im_server.storage.conversations import ConvRow, MemberRow

INF = 2**63 - 1
RECALL_WAIT_S = 2.0


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
    m = await conversations.member(conn, ref.conv_id, user_id) if conv else None
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
    return {"messages": msgs, "min_seq": win.lo, "max_seq": win.hi, "is_end": is_end}


def m_end(m: MemberRow) -> int:
    """The last seq a member may ever see: its window end, open for active members."""
    return m.max_seq if m.max_seq is not None else INF


async def do_recall(ctx: Context, user_id: int, ref: ConvRef, seq: int) -> dict[str, Any]:
    """The sender, within the recall window, replaces a message by a ``recall`` notice:
    the notice goes through the send pipeline (pushed to everyone, stored with its own
    seq) and the persister blanks the original (content gone, seq kept)."""
    msg, m = await _recallable(ctx, user_id, ref, seq)
    if msg is None or msg["content_type"] in ("system", "recall"):
        raise not_found("no such message")
    if msg["sender_id"] != user_id:
        raise ImError("forbidden", "only the sender can recall a message")
    if ref.kind == "group" and not m.active:
        raise ImError("not_member", "you are no longer a member of this group")
    if msg["recalled"]:
        raise ImError("conflict", "already recalled")
    if time.time() * 1000 - msg["server_time"] > ctx.settings.recall_window_seconds * 1000:
        raise ImError(
            "forbidden", f"messages can be recalled for {ctx.settings.recall_window_seconds} s"
        )
    ack = await send.send_system(ctx, user_id, ref, "recall", {"seq": seq})
    # blank it now (the persister does it again when it stores the notice; doing it here
    # too covers several persisters storing the original and the notice concurrently)
    async with ctx.db.begin() as conn:
        await messages.blank_recalled(conn, [(ref.conv_id, seq)])
    return {"conv_id": ref.conv_id, "seq": seq, "recall_seq": ack["seq"]}


async def _recallable(
    ctx: Context, user_id: int, ref: ConvRef, seq: int
) -> tuple[dict[str, Any] | None, MemberRow]:
    """The message at ``seq`` if the caller's window holds it, and the caller's row.

    A message recalled right after its ack may not be stored yet, so a seq that was
    handed out but is not persisted is waited for, briefly; a seq never handed out (past
    the conversation's allocated end) is answered at once."""
    end: int | None = None
    deadline = time.monotonic() + RECALL_WAIT_S
    while True:
        async with ctx.db.connect() as conn:
            conv, m = await load_member(conn, ref, user_id)
            win = window(conv, m)
            if not win.lo <= seq <= m_end(m):
                return None, m
            msg = await messages.message_at(conn, ref.conv_id, seq)
        if msg is not None or seq <= conv.max_seq:
            return msg, m
        if end is None:
            end = await seqs.current_end(ctx, ref.conv_id)
        if seq > end or time.monotonic() >= deadline:
            return None, m
        await asyncio.sleep(0.05)
