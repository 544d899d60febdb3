"""Users and session tokens (stored as SHA-256 of the token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage import push
from im_server.storage.db import now_ms


@dataclass(slots=True)
class UserRow:
    user_id: int
    username: str
    display_name: str
    password_hash: str
    deleted: bool = False
    kind: str = "user"  # or "bot" (made by the app's servers)


async def create_user(
    conn: AsyncConnection, username: str, username_key: str, display_name: str, password_hash: str
) -> int | None:
    """Insert a user; None when the username (or another with the same key) is taken."""
    try:
        async with conn.begin_nested():
            r = await conn.execute(
                text(
                    "INSERT INTO users (username, username_key, display_name, password_hash, "
                    "created_at) VALUES (:u, :k, :d, :p, :t) RETURNING user_id"
                ),
                {
                    "u": username,
                    "k": username_key,
                    "d": display_name,
                    "p": password_hash,
                    "t": now_ms(),
                },
            )
            return int(r.scalar_one())
    except IntegrityError:
        return None


async def user_by_name(conn: AsyncConnection, username: str, username_key: str) -> UserRow | None:
    """The user of a (normalised) username: the one whose username is exactly this, else
    the one with the same key. The exact match first serves the users whose username
    predates keys and collides with an older one's (their key is not the plain key)."""
    r = await conn.execute(
        text(
            "SELECT user_id, username, display_name, password_hash, false, kind FROM users "
            "WHERE (username = :u OR username_key = :k) AND deleted_at IS NULL "
            "ORDER BY (username = :u) DESC LIMIT 1"
        ),
        {"u": username, "k": username_key},
    )
    row = r.first()
    return UserRow(*row) if row else None


async def lock_user(conn: AsyncConnection, user_id: int) -> str | None:
    """Lock the user's row until the transaction ends, so the session changes of one user
    (a login on a device, a password change) happen one after the other; NO KEY UPDATE
    does not block inserts that reference the user. Returns the current password hash
    (None: no such user), for the caller to see whether it changed meanwhile."""
    r = await conn.execute(
        text("SELECT password_hash FROM users WHERE user_id = :u FOR NO KEY UPDATE"),
        {"u": user_id},
    )
    row = r.first()
    return str(row[0]) if row else None


async def set_password_hash(conn: AsyncConnection, user_id: int, password_hash: str) -> None:
    await conn.execute(
        text("UPDATE users SET password_hash = :p WHERE user_id = :u"),
        {"p": password_hash, "u": user_id},
    )


async def user_by_id(conn: AsyncConnection, user_id: int) -> UserRow | None:
    """The user, a deleted one too (``deleted`` says so)."""
    r = await conn.execute(
        text(
            "SELECT user_id, username, display_name, password_hash, deleted_at IS NOT NULL, "
            "kind FROM users WHERE user_id = :u"
        ),
        {"u": user_id},
    )
    row = r.first()
    return UserRow(*row) if row else None


async def existing_user_ids(conn: AsyncConnection, user_ids: list[int]) -> set[int]:
    r = await conn.execute(
        text("SELECT user_id FROM users WHERE user_id = ANY(:ids) AND deleted_at IS NULL"),
        {"ids": user_ids},
    )
    return {int(x) for x in r.scalars()}


# ---- deletion ---------------------------------------------------------------------------------


def deleted_name(user_id: int) -> str:
    """What a deleted user's username and key become: no username can have a '#', so it
    frees the name for a new registration and matches no login or look-up."""
    return f"#deleted:{user_id}"


async def deleted_at(conn: AsyncConnection, user_id: int) -> int | None:
    """When the user was deleted (ms); None for a live user (or no such user)."""
    r = await conn.execute(text("SELECT deleted_at FROM users WHERE user_id = :u"), {"u": user_id})
    row = r.first()
    return int(row[0]) if row and row[0] is not None else None


async def mark_deleted(conn: AsyncConnection, user_id: int, now: int) -> bool:
    """Mark the user deleted: the username and its key are replaced (freed), the display
    name and the password hash emptied (no password matches an empty hash). False when
    already deleted (nothing written)."""
    name = deleted_name(user_id)
    r = await conn.execute(
        text(
            "UPDATE users SET deleted_at = :t, username = :n, username_key = :n, "
            "display_name = '', password_hash = '' "
            "WHERE user_id = :u AND deleted_at IS NULL RETURNING user_id"
        ),
        {"u": user_id, "t": now, "n": name},
    )
    return r.first() is not None


async def deletions_to_finish(conn: AsyncConnection, before: int, limit: int = 100) -> list[int]:
    """Users deleted before ``before`` (ms) whose clean-up is not done, oldest first."""
    r = await conn.execute(
        text(
            "SELECT user_id FROM users WHERE deleted_at IS NOT NULL AND cleaned_at IS NULL "
            "AND deleted_at < :b ORDER BY deleted_at LIMIT :n"
        ),
        {"b": before, "n": limit},
    )
    return [int(x) for x in r.scalars()]


async def mark_cleaned(conn: AsyncConnection, user_id: int, now: int) -> None:
    await conn.execute(
        text("UPDATE users SET cleaned_at = :t WHERE user_id = :u AND cleaned_at IS NULL"),
        {"u": user_id, "t": now},
    )


async def delete_push_registrations(conn: AsyncConnection, user_id: int) -> int:
    """Every push registration of the user (those of revoked sessions go with them
    already; this catches any left)."""
    return await push.delete_of_user(conn, user_id)


async def usernames(conn: AsyncConnection, user_ids: list[int]) -> dict[int, str]:
    r = await conn.execute(
        text("SELECT user_id, username FROM users WHERE user_id = ANY(:ids)"), {"ids": user_ids}
    )
    return {int(a): str(b) for a, b in r}


@dataclass(slots=True)
class SessionRow:
    token_hash: bytes
    user_id: int
    device_id: str
    created_at: int
    last_used_at: int
    expires_at: int | None = None
    label: str = ""


_SESSION_COLS = "token_hash, user_id, device_id, created_at, last_used_at, expires_at"


def _session(row: Any) -> SessionRow:
    """A row of ``_SESSION_COLS``, and ``label`` when it was selected after them."""
    label = str(row[6]) if len(row) > 6 else ""
    return SessionRow(
        bytes(row[0]), int(row[1]), str(row[2]), int(row[3]), int(row[4]), row[5], label
    )


async def create_session(
    conn: AsyncConnection,
    token_hash: bytes,
    user_id: int,
    device_id: str,
    now: int,
    expires_at: int | None = None,
    label: str = "",
) -> None:
    await conn.execute(
        text(
            "INSERT INTO sessions (token_hash, user_id, device_id, created_at, last_used_at, "
            "expires_at, label) VALUES (:h, :u, :d, :t, :t, :x, :l)"
        ),
        {"h": token_hash, "u": user_id, "d": device_id, "t": now, "x": expires_at, "l": label},
    )


_UNEXPIRED = "(expires_at IS NULL OR expires_at > :now)"


async def live_session(
    conn: AsyncConnection, token_hash: bytes, idle_cutoff: int, now: int
) -> SessionRow | None:
    """The session of a token that is neither revoked, nor past its end (a minted one),
    nor unused since ``idle_cutoff``."""
    r = await conn.execute(
        text(
            f"SELECT {_SESSION_COLS} FROM sessions "
            f"WHERE token_hash = :h AND revoked_at IS NULL AND last_used_at >= :c AND {_UNEXPIRED}"
        ),
        {"h": token_hash, "c": idle_cutoff, "now": now},
    )
    row = r.first()
    return _session(row) if row else None


async def touch_session(conn: AsyncConnection, token_hash: bytes, now: int) -> None:
    await conn.execute(
        text(
            "UPDATE sessions SET last_used_at = :t "
            "WHERE token_hash = :h AND revoked_at IS NULL AND last_used_at < :t"
        ),
        {"h": token_hash, "t": now},
    )


async def live_of(
    conn: AsyncConnection, token_hashes: list[bytes], idle_cutoff: int, now: int, touch_before: int
) -> set[bytes]:
    """Which of the tokens are live; in the same statement, mark those last used before
    ``touch_before`` as used ``now`` (their sockets are open, so they are in use)."""
    r = await conn.execute(
        text(
            "WITH live AS ("
            "  SELECT token_hash, last_used_at FROM sessions"
            "  WHERE token_hash = ANY(:hs) AND revoked_at IS NULL AND last_used_at >= :c"
            f"  AND {_UNEXPIRED}"
            "), touched AS ("
            "  UPDATE sessions s SET last_used_at = :t FROM live"
            "  WHERE s.token_hash = live.token_hash AND live.last_used_at < :b"
            "  RETURNING s.token_hash"
            ") SELECT token_hash FROM live"
        ),
        {"hs": token_hashes, "c": idle_cutoff, "t": now, "b": touch_before, "now": now},
    )
    return {bytes(h) for h in r.scalars()}


async def live_sessions(
    conn: AsyncConnection, user_id: int, idle_cutoff: int, now: int
) -> list[SessionRow]:
    r = await conn.execute(
        text(
            f"SELECT {_SESSION_COLS}, label FROM sessions "
            f"WHERE user_id = :u AND revoked_at IS NULL AND last_used_at >= :c AND {_UNEXPIRED} "
            "ORDER BY created_at, device_id"
        ),
        {"u": user_id, "c": idle_cutoff, "now": now},
    )
    return [_session(row) for row in r]


async def revoke_session(conn: AsyncConnection, token_hash: bytes, now: int) -> bool:
    """Revoke one token, its push registration with it; False if it was not live."""
    r = await conn.execute(
        text(
            "UPDATE sessions SET revoked_at = :t WHERE token_hash = :h AND revoked_at IS NULL "
            "RETURNING token_hash"
        ),
        {"h": token_hash, "t": now},
    )
    revoked = r.first() is not None
    await push.delete_of_sessions(conn, [token_hash])
    return revoked


async def revoke_device(
    conn: AsyncConnection, user_id: int, device_id: str, now: int
) -> list[SessionRow]:
    """Revoke the device's session (an idle one too) and its push registration; the rows
    revoked."""
    r = await conn.execute(
        text(
            "UPDATE sessions SET revoked_at = :t "
            "WHERE user_id = :u AND device_id = :d AND revoked_at IS NULL "
            f"RETURNING {_SESSION_COLS}"
        ),
        {"u": user_id, "d": device_id, "t": now},
    )
    rows = [_session(row) for row in r]
    await push.delete_of_sessions(conn, [row.token_hash for row in rows])
    return rows


async def revoke_user_sessions(
    conn: AsyncConnection, user_id: int, now: int, keep: bytes | None = None
) -> list[bytes]:
    """Revoke every session of the user but ``keep``, their push registrations with them;
    the token hashes revoked."""
    r = await conn.execute(
        text(
            "UPDATE sessions SET revoked_at = :t WHERE user_id = :u AND revoked_at IS NULL "
            "AND token_hash IS DISTINCT FROM :k RETURNING token_hash"
        ),
        {"u": user_id, "t": now, "k": keep},
    )
    hashes = [bytes(h) for h in r.scalars()]
    await push.delete_of_sessions(conn, hashes)
    return hashes
