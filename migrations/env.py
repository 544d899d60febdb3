"""Alembic environment: runs the migrations over asyncpg (the only driver we ship)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config


def _url() -> str:
    from im_server.config import asyncpg_url, load_settings

    url = config.get_main_option("sqlalchemy.url") or load_settings().database_url
    if not url:
        raise RuntimeError("no database URL: set IM_DATABASE_URL or pass one")
    return asyncpg_url(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _main() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_main())
