"""Group rows (the members and their windows live in conv_members)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms


async def create_group(conn: AsyncConnection, name: str, owner_id: int) -> int:
    r = await conn.execute(
        text(
            "INSERT INTO groups (name, owner_id, created_at) VALUES (:n, :o, :t) RETURNING group_id"
        ),
        {"n": name, "o": owner_id, "t": now_ms()},
    )
    return int(r.scalar_one())


async def group_exists(conn: AsyncConnection, group_id: int) -> bool:
    r = await conn.execute(text("SELECT 1 FROM groups WHERE group_id = :g"), {"g": group_id})
    return r.first() is not None
