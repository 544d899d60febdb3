"""Read state: forward-only read and delivered cursors (merged and group-committed by
the cursor batcher), their pushes, typing, and group receipts answered from cursors."""

from __future__ import annotations

from typing import Any, Literal

from im_server.context import Context
from im_server.errors import ImError, not_found
from im_server.protocol.ids import ConvRef, parse_conv_id
from im_server.protocol.server_frames import cursor_push, encode, typing_push
from im_server.services import members, permissions
from im_server.storage import cursors, messages
from im_server.storage.cursors import CursorResult


async def do_cursor(
    ctx: Context, kind: str, user_id: int, ref: ConvRef, seq: int, origin: int | None = None
) -> CursorResult:
    """Report a read (or delivered) seq; returns once the cursor is durable."""
    if ref.kind == "single" and not ref.has_user(user_id):
        raise ImError("not_member", "this single chat is not yours")
    await ctx.rate.read.hold(user_id, "read reports")
    res = await ctx.cursors.submit(kind, ref.conv_id, user_id, seq, origin)
    if not res.member:
        raise ImError("not_member", "you are not a member of this conversation")
    return res


def on_moved(ctx: Context, kind: str, res: CursorResult, origins: set[int]) -> None:
    """Pushes after a cursor moved: ``read`` to my other devices and to the peer of a
    single chat; ``delivered`` to the peer; group reads feed the receipt pusher."""
    ref = parse_conv_id(res.conv_id)
    pushed: Literal["read", "delivered"] = "read" if kind == "read" else "delivered"
    frame = encode(cursor_push(pushed, res.conv_id, res.user_id, res.value))
    exclude = next(iter(origins)) if len(origins) == 1 else None
    if kind == "read":
        ctx.events.push((res.user_id,), frame, exclude)
        if ref.kind == "group":
            ctx.receipts.touch(res.conv_id)
    if ref.kind == "single":
        ctx.events.push((ref.peer_of(res.user_id),), frame)


async def do_typing(ctx: Context, user_id: int, ref: ConvRef) -> None:
    await ctx.rate.typing.hold(user_id, "typing notices")
    users = await members.recipients(ctx, ref)
    if user_id not in users:
        raise ImError("not_member", "you are not a member of this conversation")
    if ref.kind == "single":  # typing needs the same rights as sending
        status = await permissions.single_send_status(ctx, ref, user_id)
        if status != "ok":
            raise ImError(status, "you cannot write to this user")
    frame = encode(typing_push(ref.conv_id, user_id))
    ctx.events.push([u for u in users if u != user_id], frame)


def tier(ctx: Context, member_count: int) -> int | None:
    """How many readers a receipt lists for a group this size; 0 = counts only;
    None = receipts disabled."""
    s = ctx.settings
    if member_count <= s.receipts_full_max:
        return 1_000_000  # everyone who read, former members who saw it included
    if member_count <= s.receipts_partial_max:
        return s.receipts_partial_readers
    if member_count <= s.receipts_count_max:
        return 0
    return None


async def receipts(ctx: Context, user_id: int, ref: ConvRef, seq: int) -> dict[str, Any]:
    from im_server.services.history import load_member, window

    async with ctx.db.connect() as conn:
        conv, me = await load_member(conn, ref, user_id)
        win = window(conv, me)
        if not win.lo <= seq <= win.hi:
            raise not_found("no such message in your window")
        msg = await messages.message_at(conn, ref.conv_id, seq)
        if msg is None:
            raise not_found("no such message")
        n = 2 if ref.kind == "single" else await cursors.active_member_count(conn, ref.conv_id)
        limit = tier(ctx, n)
        if limit is None:
            raise ImError(
                "receipts_disabled",
                f"receipts are off in groups above {ctx.settings.receipts_count_max}",
            )
        read_count, member_count, readers = await cursors.receipt(
            conn, ref.conv_id, seq, msg["sender_id"], limit
        )
    out: dict[str, Any] = {"seq": seq, "read_count": read_count, "member_count": member_count}
    if limit:
        out["readers"] = readers
    return out
