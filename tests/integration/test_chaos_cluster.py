"""The chaos benchmark's cluster scenario, small: kill -9 of a primary that stays dead,
then a slot move, under load on every shard (``im_server/bench/chaos/cluster.py``).
Nothing acked is lost or stored twice, no seq goes backwards, the other shards never
wait a second, the failed shard is served again once its replica is promoted, and the
moved partition takes sends again within 5 s."""

from __future__ import annotations

from pathlib import Path

from im_server.bench.chaos import cluster as chaos_cluster


async def test_a_dead_primary_and_a_slot_move_under_load(tmp_path: Path) -> None:
    res = await chaos_cluster.run(tmp_path, per_shard=2, load_s=3.0)
    print(f"\n[chaos cluster] {res}")
    assert res["acked"] > 0
    assert (res["lost"], res["duplicated"], res["seq_violations"]) == (0, 0, 0), res
    kill = res["kill_primary"]
    assert kill["promoted_after_s"] < 15, kill
    windows = kill["longest_refusal_window_s"]
    failed = kill["shard_killed"]
    assert windows[failed] < kill["promoted_after_s"] + 15, kill
    assert all(v < 1.0 for port, v in windows.items() if port != failed), kill
    move = res["slot_move"]
    assert move["moved_conv_acked_again_s"] is not None
    assert move["moved_conv_acked_again_s"] < 5, move
