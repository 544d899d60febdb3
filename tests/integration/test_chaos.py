"""Crash under load (DESIGN.md invariants 1-4 and 9): four users send continuously over
WebSocket (a window of sends in flight, refused/unavailable/lost sends retried with the
same client_msg_id, reconnecting with a short backoff) and report reads, while one
component is killed with SIGKILL and restarted. Once the load stops and the stream has
drained, PostgreSQL must hold every ok-acked message exactly once, no seq may be reused
or go back, and no read cursor may be below what the server confirmed.

The machinery (load, kills, checks) lives in ``im_server.bench.chaos``; ``scripts/bench
chaos`` runs the same scenarios with a larger load and prints the figures; here the load
is small (a few seconds per scenario) so that the file runs in about two minutes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from im_server.bench.chaos import Params, Result, run_scenario

pytestmark = pytest.mark.timeout(150)

# 4 senders x 8 sends in flight, uncapped: a few thousand messages per scenario
TEST_PARAMS = Params(
    pre_s=2.5,
    down_s=0.5,
    post_s=1.5,
    window=8,
    rate=0.0,
    read_interval=0.05,
    ack_timeout=5.0,
    recover_timeout=45.0,
    finish_timeout=30.0,
    settle_timeout=45.0,
    claim_idle_ms=2000,
    resend_sample=20,
)


@pytest.fixture
def root() -> Iterator[Path]:
    """A folder of its own under /tmp, not under pytest's basetemp: another pytest
    session starting meanwhile chmods /tmp/pytest-of-<user> back to 0700, which cuts the
    ``embedded_postgres`` user off from its PGDATA (initdb: Permission denied)."""
    path = Path(tempfile.mkdtemp(prefix="im-chaos-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _details(res: Result) -> str:
    logs = "\n".join(f"--- {name} ---\n{text}" for name, text in res.logs.items())
    return f"\n{res.report(with_logs=False)}\n{logs}"


def check(res: Result) -> None:
    """Every invariant, each with its own message (what was killed, when, what broke)."""
    print(f"\n{res.report(with_logs=False)}")
    d = _details(res)
    assert res.acked_at_kill > 0, f"no message was acked before the kill{d}"
    assert res.recovered, f"no ok ack within {TEST_PARAMS.recover_timeout} s of the restart{d}"
    assert res.settled, f"the stream did not drain within {TEST_PARAMS.settle_timeout} s{d}"
    assert not res.exited, f"processes the test did not kill are gone: {res.exited}{d}"
    # 1. no acked message lost
    assert not res.lost, f"{len(res.lost)} ok-acked messages lost: {res.lost[:10]}{d}"
    # 2. no duplicate message
    assert not res.duplicated, f"{len(res.duplicated)} duplicates: {res.duplicated[:10]}{d}"
    assert not res.resend_bad, (
        f"resends of acked client_msg_ids not answered duplicate with their first seq: "
        f"{res.resend_bad[:10]}{d}"
    )
    # 3. seq never reused, never back
    assert not res.seq_violations, (
        f"seqs acked after the restart not above those acked before the kill: "
        f"{res.seq_violations[:10]}{d}"
    )
    # 4. read cursors only move forward
    assert not res.read_regressions, (
        f"read cursors below what the server confirmed: {res.read_regressions[:10]}{d}"
    )
    assert res.read_reports_confirmed > 0, f"no read report was confirmed{d}"
    # and the history (REST) shows exactly what PostgreSQL holds
    assert not res.history_bad, f"history differs from PostgreSQL: {res.history_bad}{d}"
    assert res.unanswered == 0 and res.refused == 0, (
        f"{res.unanswered} sends never acked ok, {res.refused} refused{d}"
    )


async def test_kill9_gateway_under_load(root: Path) -> None:
    """Two gateways on the same stores (the persister in the second); users A and B are
    on the first, which is killed: their sends in flight are retried on the other one."""
    check(await run_scenario("gateway", root, TEST_PARAMS))


async def test_kill9_persister_mid_batch_same_name(root: Path) -> None:
    """Gateways with --no-persister, the persister its own process, killed while its
    INSERT of a batch waits (uncommitted, entries pending); restarted under the same
    IM_NODE_NAME, it re-reads its own pending entries."""
    res = await run_scenario("persister", root, TEST_PARAMS)
    assert "blocked (uncommitted)" in res.killed, res.killed
    check(res)


async def test_kill9_persister_mid_batch_other_name(root: Path) -> None:
    """As above, restarted under another name: the dead consumer's pending entries are
    taken over with XAUTOCLAIM once idle for IM_PERSISTER_CLAIM_IDLE_MS (2 s here)."""
    res = await run_scenario("persister-rename", root, TEST_PARAMS)
    assert "blocked (uncommitted)" in res.killed, res.killed
    check(res)
