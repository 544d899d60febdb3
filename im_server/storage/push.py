"""Push registrations (see migration 0009): one row per session, keyed by its token hash.

A row lives only as long as its session: the revocations in ``storage/accounts.py``
delete it in their own transaction, and an idle-expired session's row is skipped by every
read here (``idle_cutoff``, the rule of the token check) until it is pruned."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class Registration:
    """Where to push for one device of a user."""

    app_id: str
    pushkey: str
    platform: str  # "apns" | "fcm" | "webpush"
    device_id: str
    data: dict[str, Any] = field(default_factory=dict)  # the gateway's devices[].data


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
    data: dict[str, Any] | None = None,
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
            "(token_hash, user_id, device_id, app_id, pushkey, platform, data, created_at) "
            "VALUES (:h, :u, :d, :a, :k, :p, CAST(:j AS jsonb), :t) "
            "ON CONFLICT (token_hash) DO UPDATE SET app_id = EXCLUDED.app_id, "
            "pushkey = EXCLUDED.pushkey, platform = EXCLUDED.platform, "
            "data = EXCLUDED.data, created_at = EXCLUDED.created_at"
        ),
        {
            "h": token_hash,
            "u": user_id,
            "d": device_id,
            "a": app_id,
            "k": pushkey,
            "p": platform,
            "j": json.dumps(data or {}),
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
            "SELECT p.app_id, p.pushkey, p.platform, p.device_id, p.data FROM push_registrations p "
            f"JOIN sessions s ON s.token_hash = p.token_hash WHERE p.user_id = :u AND {_LIVE} "
            "ORDER BY p.created_at, p.device_id"
        ),
        {"u": user_id, "c": idle_cutoff},
    )
    return [Registration(str(a), str(k), str(p), str(d), dict(j or {})) for a, k, p, d, j in r]


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
            "SELECT p.user_id, p.app_id, p.pushkey, p.platform, p.device_id, p.data "
            "FROM push_registrations p JOIN sessions s ON s.token_hash = p.token_hash "
            f"WHERE p.user_id = ANY(:us) AND {_LIVE} ORDER BY p.user_id, p.created_at"
        ),
        {"us": list(user_ids), "c": idle_cutoff},
    )
    for u, a, k, p, d, j in r:
        out.setdefault(int(u), []).append(
            Registration(str(a), str(k), str(p), str(d), dict(j or {}))
        )
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
