"""Push registrations (see migration 0009): one row per session, keyed by its token hash.

A row lives only as long as its session: the revocations in ``storage/accounts.py``
delete it in their own transaction, and an idle-expired session's row is skipped by every
read here (``idle_cutoff``, the rule of the token check) until it is pruned."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class Registration:
    """Where to push for one device of a user."""

    app_id: str
    pushkey: str
    platform: str  # "apns" | "fcm"
    device_id: str


class PutResult(enum.Enum):
    OK = "ok"
    NO_SESSION = "no_session"  # revoked or expired meanwhile
    TOO_MANY = "too_many"  # the user holds the limit already


_LIVE = "s.revoked_at IS NULL AND s.last_used_at >= :c"


async def put(
    conn: AsyncConnection,
    token_hash: bytes,
    app_id: str,
    pushkey: str,
    platform: str,
    *,
    idle_cutoff: int,
    limit: int,
    now: int,
) -> PutResult:
    """Tie (app_id, pushkey) to the session of ``token_hash``, replacing the session's
    registration and taking the pushkey from any other session (the newest wins).

    The user's row is locked (registrations of one user one after the other: the limit
    holds) and the session's row is read ``FOR SHARE``, which waits for a revocation in
    flight and blocks one that comes later until this commits; the revocation's delete,
    a later statement, then sees this row. So a registration never outlives its session.
    Two sessions taking the same pushkey at once go one after the other (a transaction
    lock on the pushkey); should one still fail on the unique key (``IntegrityError``),
    the caller retries."""
    r = await conn.execute(
        text(
            "SELECT u.user_id FROM sessions s JOIN users u ON u.user_id = s.user_id "
            "WHERE s.token_hash = :h FOR NO KEY UPDATE OF u"
        ),
        {"h": token_hash},
    )
    user_id = r.scalar_one_or_none()
    if user_id is None:
        return PutResult.NO_SESSION
    r = await conn.execute(
        text(f"SELECT s.device_id FROM sessions s WHERE s.token_hash = :h AND {_LIVE} FOR SHARE"),
        {"h": token_hash, "c": idle_cutoff},
    )
    device_id = r.scalar_one_or_none()
    if device_id is None:
        return PutResult.NO_SESSION
    # the user's rows of idle-expired sessions go now: they count for nothing
    await conn.execute(
        text(
            "DELETE FROM push_registrations p USING sessions s "
            "WHERE p.user_id = :u AND s.token_hash = p.token_hash "
            "AND (s.revoked_at IS NOT NULL OR s.last_used_at < :c)"
        ),
        {"u": user_id, "c": idle_cutoff},
    )
    r = await conn.execute(
        text(
            "SELECT count(*) FROM push_registrations WHERE user_id = :u AND token_hash <> :h "
            "AND NOT (app_id = :a AND pushkey = :k)"
        ),
        {"u": user_id, "h": token_hash, "a": app_id, "k": pushkey},
    )
    if int(r.scalar_one()) >= limit:
        return PutResult.TOO_MANY
    # one registration of a pushkey at a time: a second waits here until the first
    # commits, then its delete (a later statement) sees the first's row and takes over
    await conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('push ' || :a || ' ' || :k, 0))"),
        {"a": app_id, "k": pushkey},
    )
    await conn.execute(
        text(
            "DELETE FROM push_registrations WHERE app_id = :a AND pushkey = :k AND token_hash <> :h"
        ),
        {"a": app_id, "k": pushkey, "h": token_hash},
    )
    await conn.execute(
        text(
            "INSERT INTO push_registrations "
            "(token_hash, user_id, device_id, app_id, pushkey, platform, created_at) "
            "VALUES (:h, :u, :d, :a, :k, :p, :t) "
            "ON CONFLICT (token_hash) DO UPDATE SET app_id = EXCLUDED.app_id, "
            "pushkey = EXCLUDED.pushkey, platform = EXCLUDED.platform, "
            "created_at = EXCLUDED.created_at"
        ),
        {
            "h": token_hash,
            "u": user_id,
            "d": device_id,
            "a": app_id,
            "k": pushkey,
            "p": platform,
            "t": now,
        },
    )
    return PutResult.OK


async def delete_of_sessions(conn: AsyncConnection, token_hashes: Sequence[bytes]) -> int:
    """Delete the registrations of these sessions (their end); how many went. Called by
    every revocation after its ``UPDATE sessions``, in its transaction, as a statement of
    its own: its snapshot then holds a registration committed while the update waited."""
    if not token_hashes:
        return 0
    r = await conn.execute(
        text("DELETE FROM push_registrations WHERE token_hash = ANY(:hs)"),
        {"hs": list(token_hashes)},
    )
    return int(r.rowcount)


async def delete_of_user(conn: AsyncConnection, user_id: int) -> int:
    """Delete every registration of the user (a deleted account); how many went."""
    r = await conn.execute(
        text("DELETE FROM push_registrations WHERE user_id = :u"), {"u": user_id}
    )
    return int(r.rowcount)


async def of_user(conn: AsyncConnection, user_id: int, idle_cutoff: int) -> list[Registration]:
    """The user's registrations of live sessions, oldest first."""
    r = await conn.execute(
        text(
            "SELECT p.app_id, p.pushkey, p.platform, p.device_id FROM push_registrations p "
            f"JOIN sessions s ON s.token_hash = p.token_hash WHERE p.user_id = :u AND {_LIVE} "
            "ORDER BY p.created_at, p.device_id"
        ),
        {"u": user_id, "c": idle_cutoff},
    )
    return [Registration(str(a), str(k), str(p), str(d)) for a, k, p, d in r]


async def registrations_of(
    conn: AsyncConnection, user_ids: Sequence[int], idle_cutoff: int = 0
) -> dict[int, list[Registration]]:
    """The registrations of these users, one statement (index on ``user_id``). Pass
    ``idle_cutoff`` (``services.accounts.idle_cutoff``) to leave out idle-expired
    sessions, as the token check does; revoked ones have no rows. Users without any
    registration are absent from the answer."""
    out: dict[int, list[Registration]] = {}
    if not user_ids:
        return out
    r = await conn.execute(
        text(
            "SELECT p.user_id, p.app_id, p.pushkey, p.platform, p.device_id "
            "FROM push_registrations p JOIN sessions s ON s.token_hash = p.token_hash "
            f"WHERE p.user_id = ANY(:us) AND {_LIVE} ORDER BY p.user_id, p.created_at"
        ),
        {"us": list(user_ids), "c": idle_cutoff},
    )
    for u, a, k, p, d in r:
        out.setdefault(int(u), []).append(Registration(str(a), str(k), str(p), str(d)))
    return out


async def delete_pushkeys(conn: AsyncConnection, pairs: Sequence[tuple[str, str]]) -> int:
    """Delete the registrations of these (app_id, pushkey) pairs (keys the gateway
    rejected); how many went."""
    if not pairs:
        return 0
    r = await conn.execute(
        text(
            "DELETE FROM push_registrations p USING unnest("
            "CAST(:as AS text[]), CAST(:ks AS text[])) AS x(app_id, pushkey) "
            "WHERE p.app_id = x.app_id AND p.pushkey = x.pushkey"
        ),
        {"as": [a for a, _ in pairs], "ks": [k for _, k in pairs]},
    )
    return int(r.rowcount)


async def prune_expired(conn: AsyncConnection, idle_cutoff: int, limit: int = 1000) -> int:
    """Delete up to ``limit`` registrations whose session expired idle; how many went."""
    if idle_cutoff <= 0:
        return 0
    r = await conn.execute(
        text(
            "DELETE FROM push_registrations WHERE token_hash IN ("
            "  SELECT p.token_hash FROM push_registrations p"
            "  JOIN sessions s ON s.token_hash = p.token_hash"
            "  WHERE s.last_used_at < :c LIMIT :n)"
        ),
        {"c": idle_cutoff, "n": limit},
    )
    return int(r.rowcount)


# --- the pusher's work (migration 0010) -------------------------------------------------


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
