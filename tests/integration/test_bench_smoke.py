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
    for key in (
        "ack_p99_ms",
        "delivery_p99_ms",
        "persist_lag_p99_ms",
        "server_cpu_us_per_message",
        "cpu_ratio_to_echo",
    ):
        assert key in im


def test_bench_workers_compares_one_worker_with_two() -> None:
    r = subprocess.run(
        [
            *(sys.executable, "-m", "im_server", "bench", "--workers", "2"),
            *("--client-procs", "2", "--pairs", "4", "--window", "4", "--duration", "2"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    one, two = res["runs"]
    assert (one["workers"], two["workers"]) == (1, 2)
    for run in (one, two):
        assert run["messages_delivered_per_s"] > 0 and run["client_procs"] == 2
        assert run["lost"] == 0 and run["duplicated"] == 0
        assert {"gateway", "redis", "postgres", "client"} <= set(run["cores_used"])
    assert list(two["cores_per_server_process"]) == ["parent", "worker 0", "worker 1"]
    assert res["scaling"] > 0


def test_bench_idle_holds_every_socket_through_pings() -> None:
    r = subprocess.run(
        [
            *(sys.executable, "-m", "im_server", "bench", "--idle", "60"),
            *("--idle-seconds", "1", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["idle_connections"] == res["held_by_server"] == res["open_after_idle"] == 60
    assert res["failed_to_open"] == 0 and res["sample_answering_ping"] == 60
