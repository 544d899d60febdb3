"""Sync: which of a user's conversation states changed after a version, read in one
snapshot together with the version counter, and the newest messages of each."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.conv_states import PEER_JOIN, STATE_VERSION
from im_server.storage.conversations import MESSAGE_COLUMNS, message_dict


async def changed_since(
    conn: AsyncConnection, user_id: int, since: int, limit: int
) -> tuple[list[tuple[str, int]], int]:
    """([(conv_id, version)] oldest change first, at most ``limit`` + 1; the counter
    value in the same snapshot, or ``since`` when nothing changed). Versions commit in
    order, so every change at or below the counter is visible in this snapshot."""
    r = await conn.execute(
        text(
            f"""
            SELECT m.conv_id, {STATE_VERSION} AS v, (SELECT version FROM sync_version WHERE id = 1) AS cur
              FROM conv_members m
              JOIN conversations c ON c.conv_id = m.conv_id
              {PEER_JOIN}
             WHERE m.user_id = :u AND {STATE_VERSION} > :since
             ORDER BY 2, 1
             LIMIT :lim
            """
        ),
        {"u": user_id, "since": since, "lim": limit + 1},
    )
    rows = list(r)
    cur = int(rows[0][2]) if rows else since
    return [(str(a), int(b)) for a, b, _ in rows], cur


async def recent_messages(
    conn: AsyncConnection, windows: list[tuple[str, int, int]], per_conv: int
) -> dict[str, list[dict[str, Any]]]:
    """Up to ``per_conv`` newest messages in each (conv_id, lo, hi) window, ascending."""
    out: dict[str, list[dict[str, Any]]] = {w[0]: [] for w in windows}
    if not windows or per_conv <= 0:
        return out
    r = await conn.execute(
        text(
            f"""
            SELECT x.* FROM unnest(CAST(:c AS text[]), CAST(:lo AS bigint[]), CAST(:hi AS bigint[])) AS w(c, lo, hi)
            CROSS JOIN LATERAL (
                SELECT {MESSAGE_COLUMNS} FROM messages
                 WHERE conv_id = w.c AND seq BETWEEN w.lo AND w.hi
                 ORDER BY seq DESC LIMIT :n) x
            """
        ),
        {
            "c": [w[0] for w in windows],
            "lo": [w[1] for w in windows],
            "hi": [w[2] for w in windows],
            "n": per_conv,
        },
    )
    for row in r:
        out[row[0]].append(message_dict(row))
    for msgs in out.values():
        msgs.reverse()
    return out
