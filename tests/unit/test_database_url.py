"""The spellings of a PostgreSQL URL that IM_DATABASE_URL accepts."""

from __future__ import annotations

from im_server.config import asyncpg_url, load_settings, plain_pg_url


def test_spellings_normalise() -> None:
    for given in (
        "postgresql://u:p@h:5/d",
        "postgres://u:p@h:5/d",
        "postgresql+asyncpg://u:p@h:5/d",
    ):
        assert asyncpg_url(given) == "postgresql+asyncpg://u:p@h:5/d"
        assert plain_pg_url(given) == "postgresql://u:p@h:5/d"
    assert asyncpg_url("mysql://x") == "mysql://x"


def test_settings_normalise_the_url() -> None:
    s = load_settings(database_url="postgres://u@h/d", redis_url="redis://h")
    assert s.database_url == "postgresql+asyncpg://u@h/d"
    assert s.database_dsn == "postgresql://u@h/d"
