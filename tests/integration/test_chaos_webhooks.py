"""The chaos benchmark's webhooks scenario, short: kill -9 of a delivering process under
load loses no event and breaks no conversation's order (duplicates are allowed: at
least once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from im_server.bench.chaos import webhooks


@pytest.mark.timeout(240)
async def test_kill_9_while_delivering_loses_nothing(tmp_path: Path) -> None:
    res = await webhooks.run(tmp_path, senders=4, pre_s=3.0, post_s=2.0, settle_s=90.0)
    print(res)
    assert res["acked"] > 100
    assert res["missing"] == 0
    assert res["order_violations"] == 0
    assert res["received"] == res["acked"]
