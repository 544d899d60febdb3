"""Reactions: one row per (message, user, emoji) and one count row per (message, emoji),
written together in the caller's transaction; reads take the count rows only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.protocol.types import SERVER_CONTENT_TYPES
from im_server.storage.db import now_ms


async def lock_message(conn: AsyncConnection, conv_id: str, seq: int) -> bool | None:
    """Lock the message row for this transaction (reactions to one message are written
    one at a time, so the limits hold exactly); its ``recalled``, None when absent."""
    r = await conn.execute(
        text("SELECT recalled FROM messages WHERE conv_id = :c AND seq = :q FOR UPDATE"),
        {"c": conv_id, "q": seq},
    )
    v = r.scalar_one_or_none()
    return None if v is None else bool(v)


async def mine(conn: AsyncConnection, conv_id: str, seq: int, user_id: int) -> list[str]:
    """The emojis this user put on the message."""
    r = await conn.execute(
        text(
            "SELECT emoji FROM reactions WHERE conv_id = :c AND seq = :q AND user_id = :u "
            "ORDER BY emoji"
        ),
        {"c": conv_id, "q": seq, "u": user_id},
    )
    return [str(x) for x in r.scalars()]


async def emojis(conn: AsyncConnection, conv_id: str, seq: int) -> list[str]:
    """The distinct emojis on the message (its count rows)."""
    r = await conn.execute(
        text("SELECT emoji FROM reaction_counts WHERE conv_id = :c AND seq = :q"),
        {"c": conv_id, "q": seq},
    )
    return [str(x) for x in r.scalars()]


async def add(conn: AsyncConnection, conv_id: str, seq: int, user_id: int, emoji: str) -> bool:
    """Add my reaction and count it; False (nothing changed) when it is there already."""
    p = {"c": conv_id, "q": seq, "u": user_id, "e": emoji, "n": now_ms()}
    r = await conn.execute(
        text(
            "INSERT INTO reactions (conv_id, seq, user_id, emoji, created_at) "
            "VALUES (:c, :q, :u, :e, :n) ON CONFLICT DO NOTHING"
        ),
        p,
    )
    if not r.rowcount:
        return False
    await conn.execute(
        text(
            "INSERT INTO reaction_counts (conv_id, seq, emoji, count) VALUES (:c, :q, :e, 1) "
            "ON CONFLICT (conv_id, seq, emoji) DO UPDATE SET count = reaction_counts.count + 1"
        ),
        p,
    )
    return True


async def remove(conn: AsyncConnection, conv_id: str, seq: int, user_id: int, emoji: str) -> bool:
    """Remove my reaction and uncount it (the count row goes at zero); False when absent."""
    p = {"c": conv_id, "q": seq, "u": user_id, "e": emoji}
    r = await conn.execute(
        text(
            "DELETE FROM reactions WHERE conv_id = :c AND seq = :q AND user_id = :u AND emoji = :e"
        ),
        p,
    )
    if not r.rowcount:
        return False
    r = await conn.execute(
        text(
            "DELETE FROM reaction_counts WHERE conv_id = :c AND seq = :q AND emoji = :e "
            "AND count = 1"
        ),
        p,
    )
    if not r.rowcount:
        await conn.execute(
            text(
                "UPDATE reaction_counts SET count = count - 1 "
                "WHERE conv_id = :c AND seq = :q AND emoji = :e"
            ),
            p,
        )
    return True


async def attach(conn: AsyncConnection, user_id: int, msgs: Sequence[dict[str, Any]]) -> None:
    """Fill ``reactions`` of each message dict for the reader ``user_id``: one statement
    over the count rows of the messages (at most the emoji limit per message) and an
    index probe per count row for ``mine``. Recalled messages and notices have none."""
    keys = [
        (m["conv_id"], m["seq"])
        for m in msgs
        if not m["recalled"] and m["content_type"] not in SERVER_CONTENT_TYPES
    ]
    if not keys:
        return
    r = await conn.execute(
        text(
            "SELECT rc.conv_id, rc.seq, rc.emoji, rc.count, EXISTS (SELECT 1 FROM reactions x "
            "WHERE x.conv_id = rc.conv_id AND x.seq = rc.seq AND x.user_id = :u "
            "AND x.emoji = rc.emoji) "
            "FROM unnest(CAST(:c AS text[]), CAST(:q AS bigint[])) AS k(c, q) "
            "JOIN reaction_counts rc ON rc.conv_id = k.c AND rc.seq = k.q "
            "ORDER BY rc.count DESC, rc.emoji"
        ),
        {"u": user_id, "c": [k[0] for k in keys], "q": [k[1] for k in keys]},
    )
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c, q, emoji, count, is_mine in r:
        found.setdefault((str(c), int(q)), []).append(
            {"emoji": str(emoji), "count": int(count), "mine": bool(is_mine)}
        )
    if not found:
        return
    for m in msgs:
        got = found.get((m["conv_id"], m["seq"]))
        if got is not None:
            m["reactions"] = got
