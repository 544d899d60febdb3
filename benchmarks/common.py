"""What the benchmarks share: their own stores and server in a temp folder, stopped
whatever happens, and the answer printed as a table or one JSON object."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from im_server.bench.cluster import ServerProcess, Stores


def run_with_server(
    prefix: str,
    bench: Callable[[Stores, ServerProcess], Coroutine[Any, Any, dict[str, Any]]],
    *,
    fsync: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start PostgreSQL, Redis and `im-server serve` under a temp folder, run ``bench``,
    then stop them and remove the folder; on failure the server log's tail goes to stderr.
    ``env``: settings for the server (``IM_*``)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    stores: Stores | None = None
    server: ServerProcess | None = None
    try:
        stores = Stores.start(tmp / "stores", fsync=fsync)
        server = ServerProcess(
            env={
                **stores.env(),
                "IM_LOG_LEVEL": "WARNING",
                "IM_TEST_LOG_DIR": str(tmp),
                **(env or {}),
            }
        ).start()
        try:
            return asyncio.run(bench(stores, server))
        except BaseException:
            print(server.log_tail(30), file=sys.stderr)
            raise
    finally:
        if server is not None:
            server.terminate()
        if stores is not None:
            stores.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def report(
    res: dict[str, Any], as_json: bool, print_table: Callable[[dict[str, Any]], None]
) -> None:
    if as_json:
        print(orjson.dumps(res).decode())
    else:
        print_table(res)
