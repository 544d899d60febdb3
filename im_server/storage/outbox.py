"""The notice outbox (see migration 0007): rows written in the caller's transaction,
read back by the sweep with ``SKIP LOCKED`` so two processes never send one row at the
same time."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    conv_id: str
    actor_id: int
    client_msg_id: str
    content_type: str
    content: str  # JSON text


async def add(
    conn: AsyncConnection,
    conv_id: str,
    actor_id: int,
    client_msg_id: str,
    content_type: str,
    content: str,
) -> OutboxRow:
    r = await conn.execute(
        text(
            "INSERT INTO notice_outbox "
            "(conv_id, actor_id, client_msg_id, content_type, content, created_at) "
            "VALUES (:c, :a, :m, :t, :b, :n) RETURNING id"
        ),
        {
            "c": conv_id,
            "a": actor_id,
            "m": client_msg_id,
            "t": content_type,
            "b": content,
            "n": now_ms(),
        },
    )
    return OutboxRow(int(r.scalar_one()), conv_id, actor_id, client_msg_id, content_type, content)


async def due(conn: AsyncConnection, older_than_ms: int, limit: int) -> list[OutboxRow]:
    """The oldest rows written before ``older_than_ms``, locked for this transaction;
    rows another sweep holds are skipped."""
    r = await conn.execute(
        text(
            "SELECT id, conv_id, actor_id, client_msg_id, content_type, content "
            "FROM notice_outbox "
            "WHERE created_at < :t ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED"
        ),
        {"t": older_than_ms, "n": limit},
    )
    return [OutboxRow(int(i), str(c), int(a), str(m), str(t), str(b)) for i, c, a, m, t, b in r]


async def delete(conn: AsyncConnection, ids: list[int]) -> None:
    if ids:
        await conn.execute(
            text("DELETE FROM notice_outbox WHERE id = ANY(CAST(:ids AS bigint[]))"),
            {"ids": ids},
        )


async def pending(conn: AsyncConnection) -> int:
    r = await conn.execute(text("SELECT count(*) FROM notice_outbox"))
    return int(r.scalar_one())
