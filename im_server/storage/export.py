"""What ``GET /v1/me/export`` reads: my groups and the messages I sent, by keyset pages
(the ``messages_sender`` index: conv_id, sender_id, seq), so no history is ever loaded
whole."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.conversations import MESSAGE_COLUMNS, ROLE_NAMES, message_dict


async def conversations_of(conn: AsyncConnection, user_id: int) -> list[str]:
    """Every conversation I am or was a member of, in conv_id order."""
    r = await conn.execute(
        text("SELECT conv_id FROM conv_members WHERE user_id = :u ORDER BY conv_id"),
        {"u": user_id},
    )
    return [str(c) for c in r.scalars()]


async def groups_of(conn: AsyncConnection, user_id: int) -> list[dict[str, Any]]:
    """The groups I am an active member of: id, name, my role."""
    r = await conn.execute(
        text(
            "SELECT g.group_id, g.name, m.role FROM conv_members m "
            "JOIN conversations c ON c.conv_id = m.conv_id "
            "JOIN groups g ON g.group_id = c.group_id "
            "WHERE m.user_id = :u AND m.max_seq IS NULL ORDER BY g.group_id"
        ),
        {"u": user_id},
    )
    return [
        {"group_id": int(g), "name": str(n), "role": ROLE_NAMES.get(int(role), "member")}
        for g, n, role in r
    ]


async def sent_page(
    conn: AsyncConnection, conv_id: str, user_id: int, after_seq: int, limit: int
) -> list[dict[str, Any]]:
    """The messages I sent in a conversation after ``after_seq``, in seq order."""
    r = await conn.execute(
        text(
            f"SELECT {MESSAGE_COLUMNS} FROM messages "
            "WHERE conv_id = :c AND sender_id = :u AND seq > :a ORDER BY seq LIMIT :n"
        ),
        {"c": conv_id, "u": user_id, "a": after_seq, "n": limit},
    )
    return [message_dict(row) for row in r]
