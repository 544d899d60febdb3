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
