"""Group membership in PostgreSQL: joining (set-based, any number of users), re-joining,
leaving and kicks (a window's end), roles and mutes, and the member lists the send
pipeline and the receipts read."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.conversations import GROUP, MemberRow
from im_server.storage.db import now_ms


async def upsert_members(
    conn: AsyncConnection,
    conv_id: str,
    user_ids: list[int],
    role: int,
    min_seq: int,
    read_seq: int | None,
    version: int,
) -> None:
    """Join or re-join many at once: each window is replaced (open end, new start)."""
    await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, "
            "hidden_seq, version, joined_at) SELECT :c, u, :r, :mn, NULL, CAST(:rs AS bigint), COALESCE(CAST(:rs AS bigint), 0), "
            "NULL, :v, :n FROM unnest(CAST(:us AS bigint[])) AS x(u) "
            "ON CONFLICT (conv_id, user_id) DO UPDATE SET role = EXCLUDED.role, min_seq = EXCLUDED.min_seq, "
            "max_seq = NULL, read_seq = EXCLUDED.read_seq, "
            "delivered_seq = GREATEST(conv_members.delivered_seq, EXCLUDED.delivered_seq), "
            "hidden_seq = NULL, version = EXCLUDED.version, joined_at = EXCLUDED.joined_at"
        ),
        {
            "c": conv_id,
            "us": user_ids,
            "r": role,
            "mn": min_seq,
            "rs": read_seq,
            "v": version,
            "n": now_ms(),
        },
    )


async def insert_new_members(
    conn: AsyncConnection, conv_id: str, user_ids: list[int], min_seq: int
) -> list[int]:
    """Add those of ``user_ids`` who were never members (one statement, any number): a
    window from ``min_seq``, no read cursor, version 0 (their state's version is the
    conversation's: :func:`stamp`). Rows that exist are left alone. Ascending ids of the
    rows made. Takes no lock that a writer holding the sync version waits for (new rows
    are invisible until the commit), so it runs before that lock is taken."""
    rows = await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, role, min_seq, max_seq, read_seq, "
            "delivered_seq, hidden_seq, version, joined_at) "
            "SELECT :c, u, 0, :mn, NULL, NULL, 0, NULL, 0, :n "
            "FROM unnest(CAST(:us AS bigint[])) AS x(u) "
            "ON CONFLICT (conv_id, user_id) DO NOTHING RETURNING user_id"
        ),
        {"c": conv_id, "us": user_ids, "mn": min_seq, "n": now_ms()},
    )
    return sorted(int(u) for u in rows.scalars())


async def rejoin_members(
    conn: AsyncConnection, conv_id: str, user_ids: list[int], end: int, version: int
) -> list[int]:
    """Former members among ``user_ids`` (their window closed) join again: the window is
    replaced, starting after ``end``, cursors at ``end``. Ascending ids of those rejoined.
    Existing rows: under the sync-version lock, like every update of a member row."""
    rows = await conn.execute(
        text(
            "UPDATE conv_members SET role = 0, min_seq = :e + 1, max_seq = NULL, read_seq = :e, "
            "delivered_seq = GREATEST(delivered_seq, :e), hidden_seq = NULL, version = :v, "
            "joined_at = :n "
            "WHERE conv_id = :c AND user_id = ANY(CAST(:us AS bigint[])) AND max_seq IS NOT NULL "
            "RETURNING user_id"
        ),
        {"c": conv_id, "us": user_ids, "e": end, "v": version, "n": now_ms()},
    )
    return sorted(int(u) for u in rows.scalars())


async def stamp(conn: AsyncConnection, conv_id: str, version: int) -> None:
    """Give the conversation the sync version ``version``: the state of every active
    member (new ones included) changed with it. One row, under the sync-version lock."""
    await conn.execute(
        text("UPDATE conversations SET version = GREATEST(version, :v) WHERE conv_id = :c"),
        {"c": conv_id, "v": version},
    )


async def not_active_among(conn: AsyncConnection, conv_id: str, user_ids: list[int]) -> list[int]:
    """Which of ``user_ids`` are not active members, ascending (one statement, any number
    of ids; a call naming only members returns no rows)."""
    r = await conn.execute(
        text(
            "SELECT u FROM unnest(CAST(:us AS bigint[])) AS x(u) WHERE NOT EXISTS ("
            "SELECT 1 FROM conv_members m WHERE m.conv_id = :c AND m.user_id = x.u "
            "AND m.max_seq IS NULL) ORDER BY u"
        ),
        {"c": conv_id, "us": user_ids},
    )
    return [int(x) for x in r.scalars()]


async def member(conn: AsyncConnection, conv_id: str, user_id: int) -> MemberRow | None:
    row = (
        await conn.execute(
            text(
                "SELECT conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, hidden_seq "
                "FROM conv_members WHERE conv_id = :c AND user_id = :u"
            ),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    return MemberRow(*row) if row else None


async def members(
    conn: AsyncConnection, conv_id: str, *, active_only: bool = True
) -> list[MemberRow]:
    sql = (
        "SELECT conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, hidden_seq "
        "FROM conv_members WHERE conv_id = :c"
    )
    if active_only:
        sql += " AND max_seq IS NULL"
    rows = await conn.execute(text(sql + " ORDER BY user_id"), {"c": conv_id})
    return [MemberRow(*r) for r in rows]


async def active_groups_of(conn: AsyncConnection, user_id: int) -> list[int]:
    """The groups the user is an active member of, ascending."""
    r = await conn.execute(
        text(
            "SELECT c.group_id FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id "
            "WHERE m.user_id = :u AND m.max_seq IS NULL AND c.conv_type = :g "
            "ORDER BY c.group_id"
        ),
        {"u": user_id, "g": GROUP},
    )
    return [int(x) for x in r.scalars()]


async def active_member_ids(conn: AsyncConnection, conv_id: str) -> list[int]:
    r = await conn.execute(
        text(
            "SELECT user_id FROM conv_members WHERE conv_id = :c AND max_seq IS NULL ORDER BY user_id"
        ),
        {"c": conv_id},
    )
    return [int(x) for x in r.scalars()]


async def active_member_mutes(conn: AsyncConnection, conv_id: str) -> list[tuple[int, int | None]]:
    """Each active member of a group and the end of its mute (ms; None: not muted)."""
    r = await conn.execute(
        text(
            "SELECT user_id, muted_until FROM conv_members WHERE conv_id = :c AND max_seq IS NULL "
            "ORDER BY user_id"
        ),
        {"c": conv_id},
    )
    return [(int(u), None if m is None else int(m)) for u, m in r.all()]


async def set_muted_until(
    conn: AsyncConnection, conv_id: str, user_id: int, until: int | None, version: int
) -> None:
    await conn.execute(
        text(
            "UPDATE conv_members SET muted_until = :m, version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "m": until, "v": version},
    )


async def active_members_of(conn: AsyncConnection, conv_ids: list[str]) -> list[int]:
    r = await conn.execute(
        text(
            "SELECT DISTINCT user_id FROM conv_members WHERE conv_id = ANY(:c) AND max_seq IS NULL"
        ),
        {"c": conv_ids},
    )
    return [int(x) for x in r.scalars()]


async def close_window(
    conn: AsyncConnection, conv_id: str, user_id: int, max_seq: int, version: int
) -> bool:
    r = await conn.execute(
        text(
            "UPDATE conv_members SET max_seq = :m, role = 0, version = :v "
            "WHERE conv_id = :c AND user_id = :u AND max_seq IS NULL"
        ),
        {"c": conv_id, "u": user_id, "m": max_seq, "v": version},
    )
    return (r.rowcount or 0) > 0


async def set_role(
    conn: AsyncConnection, conv_id: str, user_id: int, role: int, version: int
) -> None:
    await conn.execute(
        text("UPDATE conv_members SET role = :r, version = :v WHERE conv_id = :c AND user_id = :u"),
        {"c": conv_id, "u": user_id, "r": role, "v": version},
    )
