"""`im-server bench --group` runs end to end across two gateway processes (a smoke test:
a few seconds, no thresholds on speed; the figures live in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_group_bench_across_two_gateways_loses_nothing() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "im_server",
            "bench",
            "--group",
            "7",
            "--gateways",
            "2",
            "--clients",
            "2",
            "--window",
            "2",
            "--duration",
            "1",
            "--half-rate",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["gateways"] == 2 and res["sockets_held"] == 7
    assert res["messages_acked"] > 0
    assert res["deliveries"] == res["deliveries_expected"] == res["messages_acked"] * 6
    assert res["lost"] == 0 and res["duplicated"] == 0
    by = res["cpu_us_per_delivery_by_process"]
    assert {"gateway 1", "gateway 2", "valkey", "postgres", "load: receivers 2"} <= set(by)
    assert set(res["delivery_p50_p99_ms_by_gateway"]) == {"gateway 1", "gateway 2"}
    half = res["half_rate"]  # a second phase on the same sockets, paced
    assert half["messages_acked"] > 0 and half["lost"] == 0 and half["duplicated"] == 0
    assert half["deliveries"] == half["messages_acked"] * 6
