"""Read and delivered cursors: one multi-row forward-only UPDATE per batch, and the
receipt counts answered from the members' cursors (never from per-message rows)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

COLUMNS = {"read": "read_seq", "delivered": "delivered_seq"}


@dataclass(slots=True)
class CursorResult:
    conv_id: str
    user_id: int
    member: bool  # False: not a member of the conversation, nothing written
    value: int  # the cursor after the write
    moved: bool  # True when this batch moved it forward


async def advance(
    conn: AsyncConnection,
    kind: str,
    rows: list[tuple[str, int, int, int]],
    version: int,
    badge_due: int | None = None,
) -> list[CursorResult]:
    """Move each (conv_id, user_id) cursor to max(old, min(seq, my last visible seq)) in
    one statement. Rows are (conv_id, user_id, seq, allocated_end), allocated_end being
    the highest seq Redis handed out (-1 if unknown: the persisted end is used). The
    UPDATE only touches rows where the new value is greater (``AND new > old``), so
    concurrent or reordered batches converge to the maximum and never move back.

    ``badge_due`` (ms, read cursors with push on): users with a push registration whose
    read cursor moved get a ``push_badge`` row due then, in the same statement; a row
    already waiting keeps its due time (the burst coalesces) and counts one more read."""
    col = COLUMNS[kind]
    badge = ""
    if badge_due is not None and kind == "read":
        badge = """, badge AS (
                INSERT INTO push_badge (user_id, due_at)
                SELECT DISTINCT upd.user_id, CAST(:due AS bigint) FROM upd
                 WHERE EXISTS (SELECT 1 FROM push_registrations p WHERE p.user_id = upd.user_id)
                ON CONFLICT (user_id) DO UPDATE SET gen = push_badge.gen + 1
            )"""
    target = "LEAST(v.s, GREATEST(v.a, c.max_seq), COALESCE(m.max_seq, v.s))"
    r = await conn.execute(
        text(
            f"""
            WITH v AS (
                SELECT c, u, s, a FROM unnest(CAST(:c AS text[]), CAST(:u AS bigint[]), CAST(:s AS bigint[]),
                    CAST(:a AS bigint[])) AS v(c, u, s, a)
            ), upd AS (
                UPDATE conv_members m
                   SET {col} = GREATEST(COALESCE(m.{col}, 0), {target}),
                       version = :ver
                  FROM v, conversations c
                 WHERE m.conv_id = v.c AND m.user_id = v.u AND c.conv_id = v.c
                   AND {target} > COALESCE(m.{col}, -1)
                RETURNING m.conv_id, m.user_id, m.{col} AS val
            ){badge}
            SELECT v.c, v.u, m.user_id IS NOT NULL, COALESCE(upd.val, m.{col}, 0), upd.val IS NOT NULL
              FROM v
              LEFT JOIN conv_members m ON m.conv_id = v.c AND m.user_id = v.u
              LEFT JOIN upd ON upd.conv_id = v.c AND upd.user_id = v.u
            """
        ),
        {
            "c": [x[0] for x in rows],
            "u": [x[1] for x in rows],
            "s": [x[2] for x in rows],
            "a": [x[3] for x in rows],
            "ver": version,
            **({"due": badge_due} if badge else {}),
        },
    )
    return [CursorResult(str(a), int(b), bool(c), int(d), bool(e)) for a, b, c, d, e in r]


async def active_member_count(conn: AsyncConnection, conv_id: str) -> int:
    r = await conn.execute(
        text("SELECT count(*) FROM conv_members WHERE conv_id = :c AND max_seq IS NULL"),
        {"c": conv_id},
    )
    return int(r.scalar_one())


async def receipt(
    conn: AsyncConnection, conv_id: str, seq: int, sender_id: int, readers_limit: int | None
) -> tuple[int, int, list[int]]:
    """(read_count, member_count, readers): members who can see ``seq`` less its sender;
    readers are those whose read cursor reached it (at most ``readers_limit``)."""
    r = await conn.execute(
        text(
            "SELECT count(*) FILTER (WHERE read_seq >= :q), count(*) FROM conv_members "
            "WHERE conv_id = :c AND user_id <> :s AND min_seq <= :q AND (max_seq IS NULL OR max_seq >= :q)"
        ),
        {"c": conv_id, "q": seq, "s": sender_id},
    )
    read_count, member_count = r.one()
    readers: list[int] = []
    if readers_limit:
        rr = await conn.execute(
            text(
                "SELECT user_id FROM conv_members WHERE conv_id = :c AND user_id <> :s AND read_seq >= :q "
                "AND min_seq <= :q AND (max_seq IS NULL OR max_seq >= :q) ORDER BY user_id LIMIT :n"
            ),
            {"c": conv_id, "q": seq, "s": sender_id, "n": readers_limit},
        )
        readers = [int(x) for x in rr.scalars()]
    return int(read_count), int(member_count), readers


async def recent_read_counts(
    conn: AsyncConnection, conv_id: str, last: int
) -> list[tuple[int, int, int]]:
    """(seq, sender_id, read_count) of the conversation's ``last`` newest user messages:
    one statement over the index of cursors, for the batched ``receipt`` pushes."""
    r = await conn.execute(
        text(
            """
            SELECT x.seq, x.sender_id,
                   (SELECT count(*) FROM conv_members m
                     WHERE m.conv_id = x.conv_id AND m.user_id <> x.sender_id AND m.read_seq >= x.seq
                       AND m.min_seq <= x.seq AND (m.max_seq IS NULL OR m.max_seq >= x.seq))
              FROM (SELECT conv_id, seq, sender_id FROM messages
                     WHERE conv_id = :c AND content_type NOT IN ('system', 'recall')
                     ORDER BY seq DESC LIMIT :n) x
            """
        ),
        {"c": conv_id, "n": last},
    )
    return [(int(a), int(b), int(c)) for a, b, c in r]
