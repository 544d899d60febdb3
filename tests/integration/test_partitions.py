"""The stream partition count is recorded with the keyspace at the first start, and a
start that asks for another count is refused with one line that says what to do, before
it serves or writes anything (services/partitions.py). The cluster's default (a new
keyspace spreads over every shard) is in test_cluster_mode.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from im_server.storage.redis import keys
from tests.support import ServerProcess, Stores, rds


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
    done = await _serve(env)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("im-server:")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "IM_STREAM_PARTITIONS=4" in lines[0] and "made with 1 stream partitions" in lines[0]
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout
    async with rds(stores) as r:
        assert await r.get(keys.PARTITIONS) == "1"  # not re-recorded
