"""A server process freezes what it keeps for good and collects its young objects less
often (``runtime/heap.py``); checked in a process of its own, so pytest's is untouched."""

from __future__ import annotations

import json
import subprocess
import sys

from im_server.runtime import heap


def test_settle_freezes_the_heap_and_raises_the_young_threshold() -> None:
    code = (
        "import gc, json\n"
        "from im_server.runtime import heap\n"
        "kept = [[i] for i in range(5000)]\n"
        "before = gc.get_freeze_count()\n"
        "heap.settle()\n"
        "print(json.dumps([before, gc.get_freeze_count(), list(gc.get_threshold())]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after, threshold = json.loads(out.stdout)
    assert before == 0
    assert after >= 5000  # the kept lists, and the interpreter's own objects
    assert threshold == [heap.YOUNG_THRESHOLD, *heap.OLDER_THRESHOLDS]
