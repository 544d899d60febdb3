"""The chaos scenarios that kill a store under load (Redis, PostgreSQL, Redis replaced by
an empty one), with every invariant checked as in ``test_chaos.py`` (a module of its own
so that the suite's processes can run the two halves side by side)."""

from __future__ import annotations

from pathlib import Path

from im_server.bench.chaos import run_scenario
from tests.integration.test_chaos import TEST_PARAMS, check
from tests.integration.test_chaos import root as root  # the fixture


async def test_kill9_redis_under_load(root: Path) -> None:
    """Redis (AOF, appendfsync everysec) killed, restarted on the same port and folder:
    sends meanwhile answer ``unavailable`` and are retried with the same client_msg_id."""
    check(await run_scenario("redis", root, TEST_PARAMS))


async def test_kill9_postgres_under_load(root: Path) -> None:
    """The postmaster killed and restarted on the same port (crash recovery); the
    persister and the read-cursor batcher retry, acked messages wait in the stream."""
    check(await run_scenario("postgres", root, TEST_PARAMS))


async def test_redis_replaced_by_an_empty_one_under_load(root: Path) -> None:
    """Redis killed and its AOF folder deleted: an EMPTY Redis comes back on the same port.
    New seqs start above every old one, resends of persisted client_msg_ids answer
    duplicate with their first seq. Acked messages still only in the deleted stream are gone with
    it (``wiped``, reported); any other missing one is a loss."""
    res = await run_scenario("redis-empty", root, TEST_PARAMS)
    assert "deleted appendonlydir" in res.killed, res.killed
    check(res)
