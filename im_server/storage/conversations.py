"""Conversations and one member's own row: the conversation rows, the rows of a single
chat's two sides, a member's window, hidden point and settings, seq blocks, and how a
message row reads. Member lists and membership changes are in ``memberships.py``, the
conversation states and unread counts in ``states.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms

SINGLE, GROUP = 1, 2
ROLE_MEMBER, ROLE_ADMIN, ROLE_OWNER = 0, 1, 2
ROLE_NAMES = {ROLE_MEMBER: "member", ROLE_ADMIN: "admin", ROLE_OWNER: "owner"}
NOT_UNREAD_TYPES = ("recall", "system", "edit", "reaction")


@dataclass(slots=True)
class ConvRow:
    conv_id: str
    conv_type: int
    group_id: int | None
    min_seq: int
    max_seq: int


@dataclass(slots=True)
class MemberRow:
    conv_id: str
    user_id: int
    role: int
    min_seq: int
    max_seq: int | None
    read_seq: int | None
    delivered_seq: int
    hidden_seq: int | None

    @property
    def active(self) -> bool:
        return self.max_seq is None


async def conv_row(conn: AsyncConnection, conv_id: str) -> ConvRow | None:
    row = (
        await conn.execute(
            text(
                "SELECT conv_id, conv_type, group_id, min_seq, max_seq FROM conversations WHERE conv_id = :c"
            ),
            {"c": conv_id},
        )
    ).first()
    return ConvRow(*row) if row else None


async def conv_and_member(
    conn: AsyncConnection, conv_id: str, user_id: int
) -> tuple[ConvRow | None, MemberRow | None]:
    """The conversation and the user's row in it, in one round trip."""
    row = (
        await conn.execute(
            text(
                "SELECT c.conv_id, c.conv_type, c.group_id, c.min_seq, c.max_seq, m.conv_id, "
                "m.user_id, m.role, m.min_seq, m.max_seq, m.read_seq, m.delivered_seq, "
                "m.hidden_seq FROM conversations c LEFT JOIN conv_members m "
                "ON m.conv_id = c.conv_id AND m.user_id = :u WHERE c.conv_id = :c"
            ),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    if row is None:
        return None, None
    return ConvRow(*row[:5]), MemberRow(*row[5:]) if row[5] is not None else None


async def ensure_conversation(
    conn: AsyncConnection, conv_id: str, conv_type: int, group_id: int | None = None
) -> None:
    await conn.execute(
        text(
            "INSERT INTO conversations (conv_id, conv_type, group_id, created_at) VALUES (:c, :t, :g, :n) "
            "ON CONFLICT DO NOTHING"
        ),
        {"c": conv_id, "t": conv_type, "g": group_id, "n": now_ms()},
    )


async def ensure_single_members(
    conn: AsyncConnection, conv_id: str, a: int, b: int, version: int
) -> None:
    """Both sides of a single chat; existing rows keep their window (a clear point survives
    removing and adding back) and become visible again."""
    await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, version, joined_at) VALUES (:c, :a, :v, :n), "
            "(:c, :b, :v, :n) ON CONFLICT (conv_id, user_id) DO UPDATE SET hidden_seq = NULL, version = :v"
        ),
        {"c": conv_id, "a": a, "b": b, "v": version, "n": now_ms()},
    )


async def raise_min_seq(
    conn: AsyncConnection, conv_id: str, user_id: int, min_seq: int, version: int
) -> None:
    """Clear my side: the window starts at min_seq (never moves back)."""
    await conn.execute(
        text(
            "UPDATE conv_members SET min_seq = GREATEST(min_seq, :m), version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "m": min_seq, "v": version},
    )


async def hide(conn: AsyncConnection, conv_id: str, user_id: int, upto: int, version: int) -> None:
    await conn.execute(
        text(
            "UPDATE conv_members SET hidden_seq = GREATEST(COALESCE(hidden_seq, 0), :h), version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "h": upto, "v": version},
    )


async def settings(conn: AsyncConnection, conv_id: str, user_id: int) -> tuple[bool, bool] | None:
    """(muted, pinned) of my member row, or None without one."""
    row = (
        await conn.execute(
            text("SELECT muted, pinned FROM conv_members WHERE conv_id = :c AND user_id = :u"),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    return (bool(row[0]), bool(row[1])) if row else None


async def set_settings(
    conn: AsyncConnection,
    conv_id: str,
    user_id: int,
    muted: bool | None,
    pinned: bool | None,
    version: int,
) -> tuple[bool, bool]:
    """Set the given settings (None keeps the value) and their sync version (my state's
    only: see STATE_VERSION); returns (muted, pinned) after the write."""
    row = (
        await conn.execute(
            text(
                "UPDATE conv_members SET muted = COALESCE(CAST(:m AS boolean), muted), "
                "pinned = COALESCE(CAST(:p AS boolean), pinned), settings_version = :v "
                "WHERE conv_id = :c AND user_id = :u RETURNING muted, pinned"
            ),
            {"c": conv_id, "u": user_id, "m": muted, "p": pinned, "v": version},
        )
    ).one()
    return bool(row[0]), bool(row[1])


async def reserve_seq_block(
    conn: AsyncConnection, conv_id: str, conv_type: int, size: int
) -> tuple[int, int]:
    """Move the conversation's reserved high-water mark up by ``size``; returns (old, new).
    Seqs in (old, new] now belong to Redis, and no Redis will ever get them again."""
    r = await conn.execute(
        text(
            "INSERT INTO conversations (conv_id, conv_type, seq_reserved, created_at) VALUES (:c, :t, :s, :n) "
            "ON CONFLICT (conv_id) DO UPDATE SET seq_reserved = GREATEST(conversations.seq_reserved, "
            "conversations.max_seq) + :s RETURNING seq_reserved"
        ),
        {"c": conv_id, "t": conv_type, "s": size, "n": now_ms()},
    )
    new = int(r.scalar_one())
    return new - size, new


async def allocated_end(conn: AsyncConnection, conv_id: str) -> int:
    """Highest persisted seq (used when Redis cannot say what it handed out)."""
    r = await conn.execute(
        text("SELECT max_seq FROM conversations WHERE conv_id = :c"), {"c": conv_id}
    )
    v = r.scalar_one_or_none()
    return int(v or 0)


# The columns of a message row, in the order ``message_dict`` reads them (shared with the
# history and sync queries).
MESSAGE_COLUMNS = (
    "conv_id, seq, sender_id, client_msg_id, content_type, content, server_time, recalled, "
    "mentions, mention_all, reply_to, edited_at"
)


def message_dict(row: Any) -> dict[str, Any]:
    content = row[5]
    if isinstance(content, str):
        content = orjson.loads(content)
    return {
        "conv_id": row[0],
        "seq": int(row[1]),
        "sender_id": int(row[2]),
        "client_msg_id": row[3],
        "content_type": row[4],
        "content": content,
        "server_time": int(row[6]),
        "recalled": bool(row[7]),
        "mentions": [int(u) for u in row[8]],
        "mention_all": bool(row[9]),
        "reply_to": int(row[10]) if row[10] is not None else None,
        "edited_at": int(row[11]) if row[11] is not None else None,
        "reactions": [],  # filled for the reader by storage.reactions.attach
    }


# The visible window of member m in conversation c, and the unread cursor with the
# COALESCE fallback: my read cursor, else my last sent seq there, else 0.
