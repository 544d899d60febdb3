"""What the benchmarks of ``im-server bench <name>`` share: their own stores and server in a temp folder, stopped
whatever happens, and the answer printed as a table or one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
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
    """THE report of every benchmark: one JSON object (``--json``), or its table."""
    if as_json:
        print(orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        print_table(res)


@dataclass
class Layout:
    """One user U among many conversations (the unread and search benchmarks' data)."""

    user_id: int
    users: int
    convs: list[tuple[str, int, int | None]]
    """(conv_id, conv_type, group_id) of every conversation"""
    members: dict[str, list[int]]
    mine: list[str]
    """U's conversations"""


async def user_in_conversations(
    pg: asyncpg.Connection,
    rnd: random.Random,
    *,
    convs: int,
    u_singles: int,
    u_groups: int,
    per_conv: int,
    prefix: str,
) -> Layout:
    """Users (``<prefix><i>``), groups and ``convs`` conversations, each stored with
    ``per_conv`` as its end: U (the first user) in ``u_singles`` single chats and
    ``u_groups`` groups of 31; the rest are other people's singles and groups of 20,
    alternating. No member rows and no messages: each benchmark writes its own."""
    n_users = max(2000, u_singles + 2 * convs + 100)
    now = int(time.time() * 1000)
    await pg.execute(
        "INSERT INTO users (username, username_key, display_name, password_hash, created_at) "
        "SELECT $3 || i, $3 || i, $3 || i, 'x', $1 FROM generate_series(1, $2) i",
        now,
        n_users,
        prefix,
    )
    users = [r["user_id"] for r in await pg.fetch("SELECT user_id FROM users ORDER BY user_id")]
    u, others = users[0], users[1:]
    n_groups = u_groups + (convs - u_singles - u_groups) // 2
    group_ids = [
        r["group_id"]
        for r in await pg.fetch(
            "INSERT INTO groups (name, owner_id, created_at) "
            "SELECT 'g' || i, $1, $2 FROM generate_series(1, $3) i RETURNING group_id",
            u,
            now,
            n_groups,
        )
    ]
    out = Layout(u, n_users, [], {}, [])
    gi = peer_i = 0
    for k in range(convs):
        if k < u_singles:  # U's single chats
            p = others[peer_i]
            peer_i += 1
            cid = f"s:{min(u, p)}:{max(u, p)}"
            out.convs.append((cid, 1, None))
            out.members[cid] = [u, p]
            out.mine.append(cid)
        elif k < u_singles + u_groups:  # U's groups
            g = group_ids[gi]
            gi += 1
            cid = f"g:{g}"
            out.convs.append((cid, 2, g))
            out.members[cid] = [u, *rnd.sample(others, 30)]
            out.mine.append(cid)
        elif (k - u_singles - u_groups) % 2 == 0 and gi < len(group_ids):
            g = group_ids[gi]
            gi += 1
            cid = f"g:{g}"
            out.convs.append((cid, 2, g))
            out.members[cid] = rnd.sample(others, 20)
        else:  # other people's single chats (distinct pairs)
            a, b = others[peer_i], others[peer_i + 1]
            peer_i += 2
            cid = f"s:{min(a, b)}:{max(a, b)}"
            out.convs.append((cid, 1, None))
            out.members[cid] = [a, b]
    await pg.copy_records_to_table(
        "conversations",
        records=[(c, t, g, 1, per_conv, per_conv, 0, now) for c, t, g in out.convs],
        columns=[
            "conv_id",
            "conv_type",
            "group_id",
            "min_seq",
            "max_seq",
            "seq_reserved",
            "version",
            "created_at",
        ],
    )
    return out


def add_layout_args(ap: argparse.ArgumentParser) -> None:
    """The options of :func:`user_in_conversations` (checked by :func:`check_layout_args`)."""
    ap.add_argument("--convs", type=int, default=1000, help="conversations in all")
    ap.add_argument("--per-conv", type=int, default=1000, help="messages per conversation")
    ap.add_argument("--u-singles", type=int, default=150, help="U's single chats")
    ap.add_argument("--u-groups", type=int, default=50, help="U's groups")


def check_layout_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.u_singles + args.u_groups > args.convs:
        ap.error("U cannot be in more conversations than --convs")


def run_with_stores(
    prefix: str, bench: Callable[[Stores], Coroutine[Any, Any, dict[str, Any]]]
) -> dict[str, Any]:
    """PostgreSQL and Redis (fsync off) under a temp folder for ``bench``, stopped and
    removed whatever happens."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    stores: Stores | None = None
    try:
        stores = Stores.start(tmp / "stores", fsync=False)
        return asyncio.run(bench(stores))
    finally:
        if stores is not None:
            stores.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


async def make_api_key(database_url: str, scopes: list[str], name: str = "") -> str:
    """An API key made straight in the database, as ``im-server apikey create`` makes it
    (the benchmarks' and tests' app backends)."""
    import uuid

    from im_server.config import load_settings
    from im_server.services import apikeys
    from im_server.storage.db import create_engine

    db = create_engine(load_settings(database_url=database_url, db_pool_size=1))
    try:
        return await apikeys.create(db, name or f"k{uuid.uuid4().hex[:10]}", scopes)
    finally:
        await db.dispose()
