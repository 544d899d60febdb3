"""``im-server apikey``: create, list and revoke the API keys of the app's servers."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from im_server import logs
from im_server.config import load_settings
from im_server.errors import ImError
from im_server.services import apikeys
from im_server.storage.db import create_engine


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else "never"


async def _run(url: str, args: argparse.Namespace) -> int:
    db = create_engine(load_settings(database_url=url, db_pool_size=1, db_pool_overflow=0))
    try:
        if args.action == "create":
            key = await apikeys.create(db, args.name, args.scope.split(","))
            print(key, flush=True)
            print(
                f"the key of {args.name!r}: shown this once, only its hash is kept",
                file=sys.stderr,
            )
        elif args.action == "list":
            for k in await apikeys.listed(db):
                print(
                    f"{k.name}\tscopes={','.join(k.scopes)}\tcreated={_when(k.created_at)}"
                    f"\tlast_used={_when(k.last_used_at)}"
                )
        elif not await apikeys.revoke(db, args.name):
            print(f"no live key is named {args.name!r}", file=sys.stderr)
            return 1
        else:
            print(f"revoked {args.name!r} (every server stops taking it within 5 s)")
        return 0
    except ImError as e:
        print(f"im-server apikey: {e.message}", file=sys.stderr)
        return 2
    finally:
        await db.dispose()


def run(url: str, args: argparse.Namespace) -> int:
    return asyncio.run(_run(url, args))


def cmd_apikey(args: argparse.Namespace) -> int:
    """``im-server apikey create|list|revoke``: against IM_DATABASE_URL, else the embedded
    PostgreSQL of ``--data-dir`` (the running server's, or started for the command)."""
    settings = load_settings(**({"data_dir": Path(args.data_dir)} if args.data_dir else {}))
    logs.setup("WARNING", settings.log_format)
    started = None  # the embedded PostgreSQL this command started, stopped at its end
    try:
        url = settings.database_url
        if not url:
            from im_server.runtime.embedded import prepare_data_dir
            from im_server.runtime.pg_running import running_url
            from im_server.runtime.postgres import start_postgres

            data = prepare_data_dir(settings.data_dir)
            url = running_url(data / "pg")
            if url is None:
                started = start_postgres(data / "pg")
                url = started.url
        from im_server.storage.db import run_migrations

        run_migrations(url)
        return run(url, args)
    finally:
        if started is not None:
            started.stop()


def add_apikey_parser(sub: Any) -> None:
    """``im-server apikey create|list|revoke`` on the command's sub-parsers."""
    k = sub.add_parser("apikey", help="API keys of the app's servers (docs/server-api.md)")
    k.add_argument("--data-dir", default=None, help="the embedded stores' folder (./.im-data)")
    ksub = k.add_subparsers(dest="action", required=True)
    kc = ksub.add_parser("create", help="make a key; it is printed once")
    kc.add_argument("--name", required=True)
    kc.add_argument(
        "--scope", required=True, help="users, messages, groups, webhooks or all; comma-separated"
    )
    ksub.add_parser("list", help="the live keys (names, scopes, last use)")
    kr = ksub.add_parser("revoke", help="revoke the live key of that name")
    kr.add_argument("name")
    k.set_defaults(fn=cmd_apikey)
