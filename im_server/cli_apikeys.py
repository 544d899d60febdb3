"""``im-server apikey``: create, list and revoke the API keys of the app's servers."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

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
