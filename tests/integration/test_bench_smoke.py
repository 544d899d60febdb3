"""`im-server bench` runs end to end (a smoke test: a few seconds, no thresholds on
speed; the figures live in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_runs_and_loses_nothing() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "im_server",
            "bench",
            "--pairs",
            "3",
            "--window",
            "4",
            "--duration",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    im, echo = res["im"], res["echo"]
    assert im["acked"] > 0 and echo["round_trips_per_s"] > 0
    assert im["lost"] == 0 and im["duplicated"] == 0
    assert im["messages_delivered_per_s"] > 0
    assert im["postgres_wal_bytes_per_message"] > 100  # a message row, its keys and indexes
    for key in (
        "ack_p99_ms",
        "delivery_p99_ms",
        "persist_lag_p99_ms",
        "server_cpu_us_per_message",
        "cpu_ratio_to_echo",
    ):
        assert key in im


def test_bench_with_the_persister_apart_tells_its_cpu() -> None:
    """``--split-persister``: the persister runs as ``im-server persister`` of its own,
    every acked message is still persisted and delivered, and its CPU per message is a
    figure of its own beside the gateway's, Valkey's and PostgreSQL's."""
    r = subprocess.run(
        [
            *(sys.executable, "-m", "im_server", "bench", "--split-persister"),
            *("--pairs", "3", "--window", "4", "--duration", "2", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    im = json.loads(r.stdout)["im"]
    assert im["acked"] > 0 and im["lost"] == 0 and im["duplicated"] == 0
    by = im["server_cpu_us_per_message_by_process"]
    assert set(by) == {"gateway", "persister", "redis", "postgres"}
    assert by["persister"] > 0, by
