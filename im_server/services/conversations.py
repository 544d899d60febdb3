"""Conversation states of a user (window, cursors, unread, last message)."""

from __future__ import annotations

from typing import Any

from im_server.context import Context
from im_server.errors import ImError
from im_server.protocol.ids import ConvRef
from im_server.services import notify, seqs
from im_server.services.history import load_member
from im_server.storage import conv_states, conversations, reactions
from im_server.storage.db import next_version_txn


async def list_states(ctx: Context, user_id: int) -> list[dict[str, Any]]:
    async with ctx.db.connect() as conn:
        states = await conv_states.states(conn, user_id)
        await reactions.attach(
            conn, user_id, [s["last_message"] for s in states if s["last_message"]]
        )
    return states


async def unread(ctx: Context, user_id: int) -> dict[str, Any]:
    async with ctx.db.connect() as conn:
        counts = await conv_states.unread(conn, user_id)
    return {
        "total": sum(n for _, n, _ in counts.rows),
        "badge": counts.badge,
        "conversations": [
            {"conv_id": c, "unread": n, "mention_unread": k} for c, n, k in counts.rows
        ],
    }


async def _my_row(ctx: Context, user_id: int, ref: ConvRef) -> None:
    async with ctx.db.connect() as conn:
        await load_member(conn, ref, user_id)


async def do_clear(ctx: Context, user_id: int, ref: ConvRef) -> dict[str, Any]:
    """Clear my side: my window starts after the current end. One write, whatever the
    number of messages; the other members keep everything."""
    await _my_row(ctx, user_id, ref)
    end = await seqs.current_end(ctx, ref.conv_id)
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        await conversations.raise_min_seq(conn, ref.conv_id, user_id, end + 1, version)
    await notify.changed(ctx, [user_id])
    return {"conv_id": ref.conv_id, "min_seq": end + 1}


async def do_hide(ctx: Context, user_id: int, ref: ConvRef) -> None:
    """Hide from my list until a message after the current end arrives."""
    await _my_row(ctx, user_id, ref)
    end = await seqs.current_end(ctx, ref.conv_id)
    async with ctx.db.begin() as conn:
        version = await next_version_txn(conn)
        await conversations.hide(conn, ref.conv_id, user_id, end, version)
    await notify.changed(ctx, [user_id])


async def do_settings(
    ctx: Context, user_id: int, ref: ConvRef, muted: bool | None, pinned: bool | None
) -> dict[str, Any]:
    """Set my own ``muted`` / ``pinned`` (None keeps the value) on any conversation that
    has my member row, i.e. every one my list can show, a group I left included (the
    same rule as clear and hide). A request that changes nothing writes nothing and
    takes no sync version; one that does moves my row's version, so my other devices'
    sync returns the state."""
    async with ctx.db.connect() as conn:
        await load_member(conn, ref, user_id)
        current = await conversations.settings(conn, ref.conv_id, user_id)
    if current is None:  # load_member found it; member rows are never deleted
        raise ImError("not_member", "you are not a member of this conversation")
    want = (current[0] if muted is None else muted, current[1] if pinned is None else pinned)
    if want != current:
        async with ctx.db.begin() as conn:
            version = await next_version_txn(conn)
            current = await conversations.set_settings(
                conn, ref.conv_id, user_id, muted, pinned, version
            )
        await notify.changed(ctx, [user_id])
    return {"conv_id": ref.conv_id, "muted": current[0], "pinned": current[1]}
