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
    return run_with_stacks(prefix, {"": env or {}}, lambda stacks: bench(*stacks[""]), fsync=fsync)


def run_with_stacks(
    prefix: str,
    envs: dict[str, dict[str, str]],
    bench: Callable[[dict[str, tuple[Stores, ServerProcess]]], Coroutine[Any, Any, dict[str, Any]]],
    *,
    fsync: bool = False,
) -> dict[str, Any]:
    """Like :func:`run_with_server`, with one stack (stores and server) per name in
    ``envs``, each with its own settings, for a benchmark that compares two settings in
    the same run without one server's background work touching the other's stores."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    started: dict[str, tuple[Stores, ServerProcess]] = {}
    stores: list[Stores] = []
    servers: list[ServerProcess] = []
    try:
        for i, (name, env) in enumerate(envs.items()):
            st = Stores.start(tmp / f"stores{i}", fsync=fsync)
            stores.append(st)
            server = ServerProcess(
                env={
                    **st.env(),
                    "IM_LOG_LEVEL": "WARNING",
                    "IM_TEST_LOG_DIR": str(tmp),
                    **env,
                }
            )
            servers.append(server)
            started[name] = (st, server.start())
        try:
            return asyncio.run(bench(started))
        except BaseException:
            for server in servers:
                print(server.log_tail(30), file=sys.stderr)
            raise
    finally:
        for server in servers:
            server.terminate()
        for st in stores:
            st.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def report(
    res: dict[str, Any], as_json: bool, print_table: Callable[[dict[str, Any]], None]
) -> None:
    if as_json:
        print(orjson.dumps(res).decode())
    else:
        print_table(res)
