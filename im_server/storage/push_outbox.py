"""The push outbox, the pusher's work (see migration 0010): messages and badges to push,
leased by one pusher at a time, and what a push needs to know about each (its message,
its recipients, the messages after it that the unread count sees). Registrations, where
to push, are in ``storage/push.py``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class PushMessage:
    """A claimed message to push, as the pusher needs it."""

    conv_id: str
    seq: int
    sender_id: int
    sender_name: str
    content_type: str
    content: str | None  # JSON text; None once recalled
    server_time: int


@dataclass(frozen=True, slots=True)
class Recipient:
    """A member to push a message to: can see it, is not its sender, holds a push
    registration, and did not mute the conversation (or is mentioned). ``cursor`` is the
    read cursor the unread count uses."""

    conv_id: str
    seq: int
    user_id: int
    cursor: int
    muted: bool
    window_end: int  # the last seq the member can see (closed windows: kicked, left)


@dataclass(frozen=True, slots=True)
class Later:
    """A message after a pushed one in its conversation, as the unread count sees it."""

    conv_id: str
    seq: int
    sender_id: int
    mentions: tuple[int, ...]
    mention_all: bool


async def claim_messages(
    conn: AsyncConnection, now: int, lease_ms: int, limit: int
) -> list[tuple[str, int, int]]:
    """Lease up to ``limit`` of the oldest unleased rows (another pusher's lease, or
    ``SKIP LOCKED``, keeps two pushers off one row); (conv_id, seq, created_at)."""
    r = await conn.execute(
        text(
            "UPDATE push_outbox o SET lease_until = :l, attempts = o.attempts + 1 "
            "FROM (SELECT conv_id, seq FROM push_outbox WHERE lease_until < :n "
            "      ORDER BY created_at LIMIT :k FOR UPDATE SKIP LOCKED) AS t "
            "WHERE o.conv_id = t.conv_id AND o.seq = t.seq "
            "RETURNING o.conv_id, o.seq, o.created_at"
        ),
        {"n": now, "l": now + lease_ms, "k": limit},
    )
    return sorted((str(c), int(q), int(t)) for c, q, t in r)


async def messages_to_push(
    conn: AsyncConnection, keys: Sequence[tuple[str, int]]
) -> list[PushMessage]:
    """The claimed messages still worth a push (recalled ones are left out)."""
    if not keys:
        return []
    r = await conn.execute(
        text(
            "SELECT x.conv_id, x.seq, x.sender_id, COALESCE(u.display_name, ''), x.content_type, "
            "       x.content::text, x.server_time "
            "FROM unnest(CAST(:cs AS text[]), CAST(:qs AS bigint[])) AS z(c, q) "
            "JOIN messages x ON x.conv_id = z.c AND x.seq = z.q "
            "LEFT JOIN users u ON u.user_id = x.sender_id "
            "WHERE NOT x.recalled ORDER BY x.server_time, x.conv_id, x.seq"
        ),
        {"cs": [c for c, _ in keys], "qs": [q for _, q in keys]},
    )
    return [
        PushMessage(str(c), int(q), int(s), str(n), str(t), None if b is None else str(b), int(ts))
        for c, q, s, n, t, b, ts in r
    ]


async def recipients(
    conn: AsyncConnection, keys: Sequence[tuple[str, int]], cursor_sql: str
) -> list[Recipient]:
    """Who gets a push for each message: members whose window holds it, but not its
    sender, with a registration, and either not muted or mentioned (a mention breaks
    through a mute). ``cursor_sql`` is the unread statement's cursor expression, so the
    badge arithmetic here follows the same rule."""
    if not keys:
        return []
    r = await conn.execute(
        text(
            f"SELECT z.c, z.q, m.user_id, {cursor_sql}, m.muted, "
            "       COALESCE(m.max_seq, 9223372036854775807) "
            "FROM unnest(CAST(:cs AS text[]), CAST(:qs AS bigint[])) AS z(c, q) "
            "JOIN messages x ON x.conv_id = z.c AND x.seq = z.q "
            "JOIN conversations c ON c.conv_id = z.c "
            "JOIN conv_members m ON m.conv_id = z.c "
            "WHERE m.user_id <> x.sender_id "
            "  AND z.q >= GREATEST(c.min_seq, m.min_seq) "
            "  AND z.q <= COALESCE(m.max_seq, 9223372036854775807) "
            "  AND (NOT m.muted OR x.mention_all OR m.user_id = ANY(x.mentions)) "
            "  AND EXISTS (SELECT 1 FROM push_registrations p WHERE p.user_id = m.user_id)"
        ),
        {"cs": [c for c, _ in keys], "qs": [q for _, q in keys]},
    )
    return [Recipient(str(c), int(q), int(u), int(k), bool(mu), int(e)) for c, q, u, k, mu, e in r]


async def later_messages(
    conn: AsyncConnection, firsts: Mapping[str, int], not_counted: Sequence[str], limit: int
) -> list[Later]:
    """The messages the unread count could count (not notices) in each conversation
    after ``firsts[conv]``: a pushed message's badge is the badge now less those that
    came after it. At most ``limit`` per conversation (a longer tail is left out: the
    badge then counts a few messages early, never misses one)."""
    if not firsts:
        return []
    convs = sorted(firsts)
    r = await conn.execute(
        text(
            "SELECT y.conv_id, y.seq, y.sender_id, y.mentions, y.mention_all "
            "FROM unnest(CAST(:cs AS text[]), CAST(:qs AS bigint[])) AS z(c, q) "
            "CROSS JOIN LATERAL (SELECT x.conv_id, x.seq, x.sender_id, x.mentions, x.mention_all "
            "  FROM messages x WHERE x.conv_id = z.c AND x.seq > z.q "
            "   AND x.content_type <> ALL(CAST(:nc AS text[])) "
            "  ORDER BY x.seq LIMIT :k) AS y"
        ),
        {"cs": convs, "qs": [firsts[c] for c in convs], "nc": list(not_counted), "k": limit},
    )
    return [Later(str(c), int(q), int(s), tuple(mn or ()), bool(ma)) for c, q, s, mn, ma in r]


async def release_messages(
    conn: AsyncConnection, keys: Sequence[tuple[str, int]], retry_at: int
) -> None:
    """Give claimed rows back, to be taken again from ``retry_at`` (ms)."""
    if keys:
        await conn.execute(
            text(
                "UPDATE push_outbox o SET lease_until = :r "
                "FROM unnest(CAST(:cs AS text[]), CAST(:qs AS bigint[])) AS z(c, q) "
                "WHERE o.conv_id = z.c AND o.seq = z.q"
            ),
            {"cs": [c for c, _ in keys], "qs": [q for _, q in keys], "r": retry_at},
        )


async def finish_messages(conn: AsyncConnection, keys: Sequence[tuple[str, int]]) -> None:
    """The rows whose pushes all went out."""
    if keys:
        await conn.execute(
            text(
                "DELETE FROM push_outbox o "
                "USING unnest(CAST(:cs AS text[]), CAST(:qs AS bigint[])) AS z(c, q) "
                "WHERE o.conv_id = z.c AND o.seq = z.q"
            ),
            {"cs": [c for c, _ in keys], "qs": [q for _, q in keys]},
        )


async def claim_badges(
    conn: AsyncConnection, now: int, lease_ms: int, limit: int
) -> list[tuple[int, int]]:
    """Lease up to ``limit`` badge rows whose coalescing ended; (user_id, gen)."""
    r = await conn.execute(
        text(
            "UPDATE push_badge b SET lease_until = :l "
            "FROM (SELECT user_id FROM push_badge WHERE due_at <= :n AND lease_until < :n "
            "      ORDER BY due_at LIMIT :k FOR UPDATE SKIP LOCKED) AS t "
            "WHERE b.user_id = t.user_id RETURNING b.user_id, b.gen"
        ),
        {"n": now, "l": now + lease_ms, "k": limit},
    )
    return sorted((int(u), int(g)) for u, g in r)


async def finish_badges(
    conn: AsyncConnection, done: Sequence[tuple[int, int]], again_at: int
) -> None:
    """Delete the badge rows pushed; a row that took more reads meanwhile (its ``gen``
    moved) stays, due again at ``again_at``, so the final badge is pushed too."""
    if not done:
        return
    us, gs = [u for u, _ in done], [g for _, g in done]
    p = {"us": us, "gs": gs, "a": again_at}
    z = "unnest(CAST(:us AS bigint[]), CAST(:gs AS int[])) AS z(u, g)"
    await conn.execute(
        text(f"DELETE FROM push_badge b USING {z} WHERE b.user_id = z.u AND b.gen = z.g"), p
    )
    await conn.execute(
        text(
            f"UPDATE push_badge b SET due_at = :a, lease_until = 0, gen = 0 FROM {z} "
            "WHERE b.user_id = z.u"
        ),
        p,
    )


async def release_badges(conn: AsyncConnection, user_ids: Sequence[int], retry_at: int) -> None:
    if user_ids:
        await conn.execute(
            text(
                "UPDATE push_badge SET lease_until = :r WHERE user_id = ANY(CAST(:us AS bigint[]))"
            ),
            {"us": list(user_ids), "r": retry_at},
        )


async def backlog(conn: AsyncConnection) -> tuple[int, int | None]:
    """Rows waiting in the push outbox and the oldest one's created_at (ms)."""
    r = (await conn.execute(text("SELECT count(*), min(created_at) FROM push_outbox"))).one()
    return int(r[0]), None if r[1] is None else int(r[1])
