"""Migration 0017 (API keys, users by external id, minted tokens' end, idempotency
records) on a populated 0016 database, and back: the users and sessions there keep
working, as users of kind ``user`` with sessions that never end."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from im_server.runtime.embedded import start_postgres
from tests.integration.test_messages_partitioned import dsn, migrate


async def test_0017_on_a_populated_database_and_back(tmp_path: Path) -> None:
    pgs = start_postgres(tmp_path / "pg", fsync=False)
    try:
        await migrate(pgs, "0016")
        conn = await asyncpg.connect(dsn(pgs))
        try:
            uid = await conn.fetchval(
                "INSERT INTO users (username, username_key, display_name, password_hash, "
                "created_at) VALUES ('old', 'old', 'Old', 'h', 1) RETURNING user_id"
            )
            await conn.execute(
                "INSERT INTO sessions (token_hash, user_id, device_id, created_at, "
                "last_used_at) VALUES ('\\x01', $1, 'd', 1, 1)",
                uid,
            )
            await migrate(pgs, "head")
            row = await conn.fetchrow(
                "SELECT kind, external_id, tokens_valid_after FROM users WHERE user_id = $1", uid
            )
            assert dict(row) == {"kind": "user", "external_id": None, "tokens_valid_after": None}
            assert await conn.fetchval("SELECT expires_at FROM sessions") is None
            # external ids are unique among live users only
            await conn.execute(
                "INSERT INTO users (username, username_key, display_name, password_hash, "
                "created_at, external_id, deleted_at) VALUES ('#d:1', '#d:1', '', '', 1, 'x', 5)"
            )
            await conn.execute(
                "INSERT INTO users (username, username_key, display_name, password_hash, "
                "created_at, external_id) VALUES ('@x', '@x', 'x', '', 1, 'x')"
            )
            try:
                await conn.execute(
                    "INSERT INTO users (username, username_key, display_name, password_hash, "
                    "created_at, external_id) VALUES ('@x2', '@x2', 'x', '', 1, 'x')"
                )
                raise AssertionError("two live users with one external id")
            except asyncpg.UniqueViolationError:
                pass
            await migrate(pgs, "0016", down=True)
            cols = {
                r["column_name"]
                for r in await conn.fetch(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'users'"
                )
            }
            assert "external_id" not in cols and "kind" not in cols
            assert await conn.fetchval("SELECT to_regclass('api_keys')") is None
            await migrate(pgs, "head")
            assert await conn.fetchval("SELECT count(*) FROM users WHERE user_id = $1", uid) == 1
        finally:
            await conn.close()
    finally:
        pgs.stop()
