"""Users and session tokens (stored as SHA-256 of the token)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms


@dataclass(slots=True)
class UserRow:
    user_id: int
    username: str
    display_name: str
    password_hash: str


async def create_user(
    conn: AsyncConnection, username: str, display_name: str, password_hash: str
) -> int | None:
    """Insert a user; None when the username is taken."""
    try:
        async with conn.begin_nested():
            r = await conn.execute(
                text(
                    "INSERT INTO users (username, display_name, password_hash, created_at) "
                    "VALUES (:u, :d, :p, :t) RETURNING user_id"
                ),
                {"u": username, "d": display_name, "p": password_hash, "t": now_ms()},
            )
            return int(r.scalar_one())
    except IntegrityError:
        return None


async def user_by_name(conn: AsyncConnection, username: str) -> UserRow | None:
    r = await conn.execute(
        text(
            "SELECT user_id, username, display_name, password_hash FROM users WHERE username = :u"
        ),
        {"u": username},
    )
    row = r.first()
    return UserRow(*row) if row else None


async def user_by_id(conn: AsyncConnection, user_id: int) -> UserRow | None:
    r = await conn.execute(
        text("SELECT user_id, username, display_name, password_hash FROM users WHERE user_id = :u"),
        {"u": user_id},
    )
    row = r.first()
    return UserRow(*row) if row else None


async def existing_user_ids(conn: AsyncConnection, user_ids: list[int]) -> set[int]:
    r = await conn.execute(
        text("SELECT user_id FROM users WHERE user_id = ANY(:ids)"), {"ids": user_ids}
    )
    return {int(x) for x in r.scalars()}


async def usernames(conn: AsyncConnection, user_ids: list[int]) -> dict[int, str]:
    r = await conn.execute(
        text("SELECT user_id, username FROM users WHERE user_id = ANY(:ids)"), {"ids": user_ids}
    )
    return {int(a): str(b) for a, b in r}


async def create_session(
    conn: AsyncConnection, token_hash: bytes, user_id: int, device_id: str
) -> None:
    await conn.execute(
        text(
            "INSERT INTO sessions (token_hash, user_id, device_id, created_at) VALUES (:h, :u, :d, :t)"
        ),
        {"h": token_hash, "u": user_id, "d": device_id, "t": now_ms()},
    )


async def session_by_hash(conn: AsyncConnection, token_hash: bytes) -> tuple[int, str] | None:
    r = await conn.execute(
        text(
            "SELECT user_id, device_id FROM sessions WHERE token_hash = :h AND revoked_at IS NULL"
        ),
        {"h": token_hash},
    )
    row = r.first()
    return (int(row[0]), str(row[1])) if row else None


async def revoke_session(conn: AsyncConnection, token_hash: bytes) -> None:
    await conn.execute(
        text("UPDATE sessions SET revoked_at = :t WHERE token_hash = :h AND revoked_at IS NULL"),
        {"h": token_hash, "t": now_ms()},
    )
