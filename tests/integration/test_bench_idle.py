"""`im-server bench --idle` runs end to end (a smoke test, no thresholds on speed)."""

from __future__ import annotations

import json
import subprocess
import sys


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
