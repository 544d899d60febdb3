"""The stream partition count is recorded with the keyspace at the first start, and a
start that asks for another count is refused with one line that says what to do, before
it serves or writes anything (services/partitions.py). The cluster's default (a new
keyspace spreads over every shard) is in test_cluster_mode.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from im_server.runtime.embedded import start_redis
from im_server.storage.redis import keys
from im_server.storage.redis.store import RedisStore
from tests.support import ServerProcess, Stores, rds, start_redis_62


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """The start ended before serving, with one ``im-server:`` line holding ``words``."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("im-server:")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


async def test_a_single_redis_keyspace_records_one_partition(
    stores: Stores, server: ServerProcess
) -> None:
    assert server.url  # the suite's server has started on this keyspace
    async with rds(stores) as r:
        assert await r.get(keys.PARTITIONS) == "1"


async def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "im_server", "serve", "--port", "0", "--workers", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_start_with_another_count_is_refused_and_changes_nothing(
    stores: Stores, server: ServerProcess
) -> None:
    assert server.url
    env = {**os.environ, **stores.env(), "IM_STREAM_PARTITIONS": "4"}
    refused(await _serve(env), "IM_STREAM_PARTITIONS=4", "made with 1 stream partitions")
    async with rds(stores) as r:
        assert await r.get(keys.PARTITIONS) == "1"  # not re-recorded


async def test_a_redis_older_than_7_is_refused_at_start(stores: Stores, tmp_path: Path) -> None:
    """Redis 6.2 cannot run the send script (SET NX GET): the start is refused with one
    line that says so, before it serves, and the old server is left as it was."""
    rdir = tmp_path / "redis62"
    rdir.mkdir()
    old, port = start_redis_62(rdir)
    try:
        env = {**os.environ, **stores.env(), "IM_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
        refused(await _serve(env), "serves Redis 6.2", "7.0 or later")
        store = RedisStore(f"redis://127.0.0.1:{port}/0", dedupe_ttl=60)
        try:
            assert await store.client.dbsize() == 0  # nothing recorded
        finally:
            await store.close()
    finally:
        old.terminate()
        old.wait(30)


async def test_a_keyspace_with_a_stream_is_one_made_before_the_record(tmp_path: Path) -> None:
    """The upgrade case is told by the keyspace itself: partition 0's stream exists in
    one that served sends (whatever its count), and none in a new one, even beside a
    database that holds data (a move to a new cluster: every key is new anyway)."""
    rd = start_redis(tmp_path / "redis")
    store = RedisStore(rd.url, dedupe_ttl=60)
    try:
        assert await store.has_streams() is False
        await store.ensure_group(0)
        assert await store.has_streams() is True
        assert await store.record_partitions(1) == 1
        assert await store.record_partitions(64) == 1  # the first record stays
        assert await store.recorded_partitions() == 1
    finally:
        await store.close()
        rd.stop()
