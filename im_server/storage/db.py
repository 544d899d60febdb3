"""The PostgreSQL engine, migrations, and the sync version counter."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from im_server.config import Settings

ROOT = Path(__file__).resolve().parent.parent.parent


def now_ms() -> int:
    return int(time.time() * 1000)


def create_engine(settings: Settings) -> AsyncEngine:
    assert settings.database_url
    return create_async_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_overflow,
        pool_pre_ping=True,
        # an error's text never carries its statement's parameters (token hashes,
        # password hashes), so logging an exception cannot leak them
        hide_parameters=True,
        pool_timeout=settings.store_timeout_seconds,
        connect_args={"timeout": settings.store_timeout_seconds, "command_timeout": 30},
    )


def run_migrations(url: str) -> None:
    """``alembic upgrade head``. Synchronous; from inside a running event loop it runs in
    a thread of its own (Alembic's env.py starts its own loop)."""
    import asyncio
    import threading

    from alembic import command
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(cfg, "head")
        return
    errors: list[BaseException] = []

    def _run() -> None:
        try:
            command.upgrade(cfg, "head")
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    t = threading.Thread(target=_run)
    t.start()
    t.join()
    if errors:
        raise errors[0]


async def ping(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def next_version_txn(conn: AsyncConnection) -> int:
    """Take the next sync version. The row lock is held until the transaction commits, so
    versions become visible in order: no reader can see N while a writer of N-1 is open.
    Every writing transaction takes it first: one lock order everywhere, so writers
    never deadlock on it."""
    r = await conn.execute(
        text("UPDATE sync_version SET version = version + 1 WHERE id = 1 RETURNING version")
    )
    return int(r.scalar_one())
