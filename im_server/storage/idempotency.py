"""The first answer to a write made under an ``Idempotency-Key`` (per API key)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(slots=True, frozen=True)
class Recorded:
    body_hash: bytes
    status: int | None  # None: the first call is still running (or died before its answer)
    answer: bytes | None
    created_at: int


async def claim(
    conn: AsyncConnection,
    key_id: int,
    idem_key: str,
    body_hash: bytes,
    now: int,
    stale: int,
    expired: int,
) -> Recorded | None:
    """Take the key for a first call (None), or the record of the call that took it.
    A record with no answer from before ``stale`` (ms) is taken over (its call died), and
    so is any record from before ``expired`` (forgotten)."""
    r = await conn.execute(
        text(
            "INSERT INTO idempotency_keys (key_id, idem_key, body_hash, created_at) "
            "VALUES (:k, :i, :h, :t) ON CONFLICT (key_id, idem_key) DO UPDATE "
            "SET body_hash = :h, created_at = :t, status = NULL, answer = NULL "
            "WHERE (idempotency_keys.status IS NULL AND idempotency_keys.created_at < :s) "
            "OR idempotency_keys.created_at < :x "
            "RETURNING key_id"
        ),
        {"k": key_id, "i": idem_key, "h": body_hash, "t": now, "s": stale, "x": expired},
    )
    if r.first() is not None:
        return None
    r = await conn.execute(
        text(
            "SELECT body_hash, status, answer, created_at FROM idempotency_keys "
            "WHERE key_id = :k AND idem_key = :i"
        ),
        {"k": key_id, "i": idem_key},
    )
    row = r.first()
    if row is None:  # pruned in between: take it
        return await claim(conn, key_id, idem_key, body_hash, now, stale, expired)
    return Recorded(bytes(row[0]), row[1], bytes(row[2]) if row[2] is not None else None, row[3])


async def answer(
    conn: AsyncConnection, key_id: int, idem_key: str, status: int, body: bytes
) -> None:
    await conn.execute(
        text(
            "UPDATE idempotency_keys SET status = :s, answer = :a "
            "WHERE key_id = :k AND idem_key = :i"
        ),
        {"k": key_id, "i": idem_key, "s": status, "a": body},
    )


async def release(conn: AsyncConnection, key_id: int, idem_key: str) -> None:
    """Forget a claim whose call failed without an answer worth keeping (a retry runs it)."""
    await conn.execute(
        text("DELETE FROM idempotency_keys WHERE key_id = :k AND idem_key = :i AND status IS NULL"),
        {"k": key_id, "i": idem_key},
    )


async def prune(conn: AsyncConnection, before: int) -> int:
    r = await conn.execute(
        text("DELETE FROM idempotency_keys WHERE created_at < :b"), {"b": before}
    )
    return int(r.rowcount or 0)
