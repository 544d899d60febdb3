"""API keys of the app's servers, stored as SHA-256 of the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(slots=True, frozen=True)
class ApiKeyRow:
    key_id: int
    name: str
    scopes: tuple[str, ...]
    created_at: int
    revoked_at: int | None
    last_used_at: int | None


_COLS = "key_id, name, scopes, created_at, revoked_at, last_used_at"


def _row(r: Any) -> ApiKeyRow:
    return ApiKeyRow(int(r[0]), str(r[1]), tuple(r[2]), int(r[3]), r[4], r[5])


async def create(
    conn: AsyncConnection, name: str, key_hash: bytes, scopes: list[str], now: int
) -> int | None:
    """A new key; None when a live key already has that name."""
    try:
        async with conn.begin_nested():
            r = await conn.execute(
                text(
                    "INSERT INTO api_keys (name, key_hash, scopes, created_at) "
                    "VALUES (:n, :h, :s, :t) RETURNING key_id"
                ),
                {"n": name, "h": key_hash, "s": scopes, "t": now},
            )
            return int(r.scalar_one())
    except IntegrityError:
        return None


async def live(conn: AsyncConnection) -> list[ApiKeyRow]:
    r = await conn.execute(
        text(f"SELECT {_COLS} FROM api_keys WHERE revoked_at IS NULL ORDER BY name")
    )
    return [_row(x) for x in r]


async def by_hash(conn: AsyncConnection, key_hash: bytes) -> ApiKeyRow | None:
    """The live key with that hash."""
    r = await conn.execute(
        text(f"SELECT {_COLS} FROM api_keys WHERE key_hash = :h AND revoked_at IS NULL"),
        {"h": key_hash},
    )
    row = r.first()
    return _row(row) if row else None


async def touch(conn: AsyncConnection, key_id: int, now: int) -> None:
    await conn.execute(
        text("UPDATE api_keys SET last_used_at = :t WHERE key_id = :k"), {"k": key_id, "t": now}
    )


async def revoke(conn: AsyncConnection, name: str, now: int) -> bytes | None:
    """Revoke the live key of that name; its hash, or None when there is none."""
    r = await conn.execute(
        text(
            "UPDATE api_keys SET revoked_at = :t WHERE name = :n AND revoked_at IS NULL "
            "RETURNING key_hash"
        ),
        {"n": name, "t": now},
    )
    row = r.first()
    return bytes(row[0]) if row else None
