"""`im-server bench --workers` runs end to end (a smoke test, no thresholds on speed)."""

from __future__ import annotations

import json
import subprocess
import sys


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
        # the whole stack against the echo, timed from the same client processes
        assert run["echo_round_trips_per_s"] > 0
        assert run["echo_stack_cpu_us_per_round_trip"] > 0
        assert run["stack_cpu_us_per_message"] > 0
        assert run["stack_ratio_to_echo"] == (
            run["stack_cpu_us_per_message"] / run["echo_stack_cpu_us_per_round_trip"]
        )
        # the clients' kernel time counted as the stack's can only add to it
        assert run["stack_with_client_kernel_us_per_message"] >= run["stack_cpu_us_per_message"]
        assert run["stack_with_client_kernel_ratio_to_echo"] > 0
    assert list(two["cores_per_server_process"]) == ["parent", "worker 0", "worker 1"]
    assert res["scaling"] > 0
