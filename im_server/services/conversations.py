"""Conversation states of a user (window, cursors, unread, last message)."""

from __future__ import annotations

from typing import Any

from im_server.context import Context
from im_server.storage import conversations


async def list_states(ctx: Context, user_id: int) -> list[dict[str, Any]]:
    async with ctx.db.connect() as conn:
        return await conversations.states(conn, user_id)


async def unread(ctx: Context, user_id: int) -> dict[str, Any]:
    async with ctx.db.connect() as conn:
        counts = await conversations.unread_counts(conn, user_id)
    return {"total": sum(n for _, n in counts), "conversations": [{"conv_id": c, "unread": n} for c, n in counts]}
