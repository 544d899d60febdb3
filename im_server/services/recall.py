"""Recall: the sender, within the recall window, replaces a message by a ``recall`` notice;
in a group the owner and admins may recall any member's message, at any age (the notice's
sender is then the moderator).

The notice goes through the send pipeline like any message (pushed to everyone, stored
with its own seq, ``content: {"seq": <original>}``), and the original is blanked: content
gone, seq kept, ``recalled: true``. Blanking happens twice on purpose: here, right after
the notice is queued, and in the persister when it stores the notice (the original may
not be stored yet when the recall is made, or be stored by another persister at the same
time). :func:`blanking` is the rule the persister applies to each batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from im_server.context import Context
from im_server.errors import ImError, not_found
from im_server.protocol.ids import ConvRef
from im_server.services import send, seqs
from im_server.services.history import INF, load_member, window
from im_server.storage import messages
from im_server.storage.conversations import ROLE_ADMIN, MemberRow
from im_server.storage.messages import NewMessage

RECALL_WAIT_S = 2.0
"""How long a recall waits for a handed-out seq to be stored (a recall right after the
ack can overtake the persister)."""

MsgKey = tuple[str, int]
"""``(conv_id, seq)``"""


async def do_recall(ctx: Context, user_id: int, ref: ConvRef, seq: int) -> dict[str, Any]:
    """Recall the message at ``seq`` (the caller's, or any member's for a group's owner
    and admins): send the notice, blank the original."""
    msg, m = await visible_message(ctx, user_id, ref, seq)
    if msg is None or msg["content_type"] in ("system", "recall"):
        raise not_found("no such message")
    moderator = ref.kind == "group" and m.active and m.role >= ROLE_ADMIN
    if msg["sender_id"] != user_id and not moderator:
        raise ImError(
            "forbidden", "only the sender, or a group's owner and admins, can recall a message"
        )
    if ref.kind == "group" and not m.active:
        raise ImError("not_member", "you are no longer a member of this group")
    if msg["recalled"]:
        raise ImError("conflict", "already recalled")
    too_old = time.time() * 1000 - msg["server_time"] > ctx.settings.recall_window_seconds * 1000
    if too_old and not moderator:
        raise ImError(
            "forbidden", f"messages can be recalled for {ctx.settings.recall_window_seconds} s"
        )
    ack = await send.send_system(ctx, user_id, ref, "recall", {"seq": seq})
    # blank it now (the persister does it again when it stores the notice; doing it here
    # too covers several persisters storing the original and the notice concurrently)
    async with ctx.db.begin() as conn:
        await messages.blank_recalled(conn, [(ref.conv_id, seq)])
    return {"conv_id": ref.conv_id, "seq": seq, "recall_seq": ack["seq"]}


def _member_end(m: MemberRow) -> int:
    """The last seq a member may ever see: its window end, open for active members."""
    return m.max_seq if m.max_seq is not None else INF


async def visible_message(
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
            if not win.lo <= seq <= _member_end(m):
                return None, m
            msg = await messages.message_at(conn, ref.conv_id, seq)
        if msg is not None or seq <= conv.max_seq:
            return msg, m
        if end is None:
            end = await seqs.current_end(ctx, ref.conv_id)
        if seq > end or time.monotonic() >= deadline:
            return None, m
        await asyncio.sleep(0.05)


# -- what a batch of stored messages blanks ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Blanking:
    """The originals that the recall notices of one batch blank."""

    in_batch: set[MsgKey]
    """Originals stored by the same batch: they go in blank from the start."""
    earlier: list[MsgKey]
    """Originals stored before (or by another persister): blanked by an update, sorted."""


def recall_target(m: NewMessage) -> MsgKey | None:
    """The original a recall notice names, None for any other message.

    Notices are made by the server (clients cannot send ``recall``); one whose content
    is not ``{"seq": <int>}`` names nothing rather than stopping the batch."""
    if m.content_type != "recall":
        return None
    try:
        content = orjson.loads(m.content_json)
    except orjson.JSONDecodeError:
        return None
    target = content.get("seq") if isinstance(content, dict) else None
    if not isinstance(target, int) or isinstance(target, bool):
        return None
    return (m.conv_id, target)


def blanking(batch: Sequence[NewMessage]) -> Blanking:
    """What the recall notices of ``batch`` blank, split by where the original is."""
    targets = {t for t in map(recall_target, batch) if t is not None}
    if not targets:
        return Blanking(set(), [])
    here = {(m.conv_id, m.seq) for m in batch} & targets
    return Blanking(here, sorted(targets - here))
