"""Group receipts by group size (thresholds configurable): readers listed; at most N
readers; counts only; disabled (403 receipts_disabled, and no receipt pushes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from im_server.client import ApiError, Client
from tests.support import ServerProcess, Stores, eventually, new_user, persisted


@pytest.fixture(scope="module")
def tiny_tiers(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        env={
            **stores.env(),
            "IM_NODE_NAME": "tiers",
            "IM_RECEIPTS_FULL_MAX": "2",
            "IM_RECEIPTS_PARTIAL_MAX": "3",
            "IM_RECEIPTS_PARTIAL_READERS": "1",
            "IM_RECEIPTS_COUNT_MAX": "4",
        }
    ).start()
    yield srv
    srv.terminate()


async def _group_read_by_all(url: str, size: int) -> tuple[Client, str, int, list[Client]]:
    owner = await new_user(url, "tier")
    others = [await new_user(url, "tm") for _ in range(size - 1)]
    g = await owner.create_group(f"size {size}", [o.user_id for o in others])
    conv = g["conv_id"]
    ack = await owner.send_rest(conv, "read me")

    async def stored() -> bool:
        return (await owner.history(conv))["max_seq"] >= ack["seq"]

    await eventually(stored)
    for o in others:
        await o.read_rest(conv, ack["seq"])
    return owner, conv, ack["seq"], others


async def test_each_tier(tiny_tiers: ServerProcess) -> None:
    url = tiny_tiers.url
    owner, conv, seq, others = await _group_read_by_all(url, 2)
    r = await owner.receipts(conv, seq)
    assert r == {"seq": seq, "read_count": 1, "member_count": 1, "readers": [others[0].user_id]}

    owner, conv, seq, others = await _group_read_by_all(url, 3)
    r = await owner.receipts(conv, seq)
    assert r["read_count"] == 2 and r["member_count"] == 2
    assert len(r["readers"]) == 1 and r["readers"][0] in {o.user_id for o in others}

    owner, conv, seq, others = await _group_read_by_all(url, 4)
    r = await owner.receipts(conv, seq)
    assert r == {"seq": seq, "read_count": 3, "member_count": 3}, "counts only: no readers"

    owner, conv, seq, others = await _group_read_by_all(url, 5)
    with pytest.raises(ApiError) as e:
        await owner.receipts(conv, seq)
    assert e.value.status == 403 and e.value.code == "receipts_disabled"
    # read cursors and unread still work there
    assert (await others[0].unread())["total"] == 0


async def test_no_receipt_pushes_above_the_threshold(tiny_tiers: ServerProcess) -> None:
    url = tiny_tiers.url
    for size, pushed in ((4, True), (5, False)):
        owner = await new_user(url, "push")
        others = [await new_user(url, "pm") for _ in range(size - 1)]
        g = await owner.create_group(f"push {size}", [o.user_id for o in others])
        conn = await owner.connect()
        ack = await conn.send(g["conv_id"], "hello all")
        # receipts are counted over persisted messages
        await persisted(owner, g["conv_id"], ack["seq"])
        for o in others:
            await o.read_rest(g["conv_id"], ack["seq"])
        ev = await conn.try_next_event("receipt", timeout=3.0)
        if pushed:
            assert ev is not None and ev["conv_id"] == g["conv_id"]
        else:
            assert ev is None, f"no receipt pushes in a group of {size} (receipts disabled)"
        await conn.close()
