"""Read state: forward-only cursors (the seed's concurrency check), clamping, pushes,
delivered cursors, and every unread rule."""

from __future__ import annotations

import asyncio
import random

import pytest

from im_server.client import ApiError, Client
from tests.support import befriend, eventually, new_user
from tests.support import persisted as _persisted


async def _unread(c: Client, conv: str) -> int:
    states = {s["conv_id"]: s for s in await c.conversations()}
    listed = {x["conv_id"]: x["unread"] for x in (await c.unread())["conversations"]}
    assert listed.get(conv, 0) == states[conv]["unread"], "GET /v1/unread and the state must agree"
    return int(states[conv]["unread"])


async def test_cursor_only_moves_forward_and_is_clamped(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca = await alice.connect()
    for i in range(10):
        await ca.send(conv, f"m{i}")
    assert (await bob.read_rest(conv, 5))["read_seq"] == 5
    assert (await bob.read_rest(conv, 3))["read_seq"] == 5, "an older report never moves it back"
    # past the end: clamped to the last allocated seq (persisted or not)
    assert (await bob.read_rest(conv, 10**12))["read_seq"] == 10
    assert (await bob.read_rest(conv, 0))["read_seq"] == 10
    await ca.close()


async def test_read_before_persisted_counts(pair: tuple[Client, Client, str]) -> None:
    """A pushed message can be read before it reaches PostgreSQL."""
    alice, bob, conv = pair
    ca = await alice.connect()
    acks = [await ca.send(conv, f"m{i}") for i in range(5)]
    top = acks[-1]["seq"]
    assert (await bob.read_rest(conv, top))["read_seq"] == top
    await _persisted(bob, conv, top)
    assert await _unread(bob, conv) == 0
    await ca.close()


async def test_seed_concurrency_check(pair: tuple[Client, Client, str]) -> None:
    """10+ concurrent writers on several devices, WS and REST mixed, each reporting 100
    random seqs: the cursor ends at the maximum, and no report ever moved it back."""
    alice, bob, conv = pair
    ca = await alice.connect()
    futs = [await ca.send_nowait(conv, f"m{i}") for i in range(300)]
    top = max(a["seq"] for a in await asyncio.gather(*futs))
    observer = await bob.connect()
    devices = [await bob.connect() for _ in range(5)]
    reported: list[int] = []
    rest_answers: list[int] = []

    async def ws_writer(dev) -> None:  # type: ignore[no-untyped-def]
        for _ in range(100):
            s = random.randint(1, top)
            reported.append(s)
            await dev.read(conv, s)

    async def rest_writer() -> None:
        for _ in range(100):
            s = random.randint(1, top)
            reported.append(s)
            rest_answers.append((await bob.read_rest(conv, s))["read_seq"])

    await asyncio.gather(*(ws_writer(d) for d in devices), *(rest_writer() for _ in range(5)))
    expected = max(reported)
    final = await eventually(lambda: _state_read(bob, conv, expected))
    assert final == expected
    pushed: list[int] = []
    while (ev := await observer.try_next_event("read", timeout=1.0)) is not None:
        pushed.append(ev["seq"])
    assert pushed, "the observer device hears of the cursor moving"
    assert pushed == sorted(pushed) and len(set(pushed)) == len(pushed), (
        "pushes only ever move forward"
    )
    assert pushed[-1] == expected
    # each REST answer is the durable cursor at that moment: at least the value reported
    assert all(a >= 1 for a in rest_answers) and max(rest_answers) <= expected
    for d in (ca, observer, *devices):
        await d.close()


async def _state_read(c: Client, conv: str, want: int) -> int | None:
    st = {s["conv_id"]: s for s in await c.conversations()}[conv]
    return st["read_seq"] if st["read_seq"] == want else None


async def test_read_pushes_to_my_devices_and_the_peer(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca = await alice.connect()
    await ca.send(conv, "hi")
    b1, b2 = await bob.connect(), await bob.connect()
    await b1.read(conv, 1)
    ev = await b2.next_event("read")
    assert ev == {"type": "read", "conv_id": conv, "user_id": bob.user_id, "seq": 1}
    ev = await ca.next_event("read")
    assert ev["user_id"] == bob.user_id and ev["seq"] == 1
    assert await b1.try_next_event("read", timeout=0.5) is None, (
        "not echoed to the reporting device"
    )
    states = {s["conv_id"]: s for s in await alice.conversations()}
    assert states[conv]["peer_read_seq"] == 1
    for c in (ca, b1, b2):
        await c.close()


async def test_delivered_cursor(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca, cb = await alice.connect(), await bob.connect()
    for i in range(3):
        await ca.send(conv, f"m{i}")
    await cb.delivered(conv, 3)
    ev = await ca.next_event("delivered")
    assert ev == {"type": "delivered", "conv_id": conv, "user_id": bob.user_id, "seq": 3}
    await cb.delivered(conv, 2)  # older: nothing moves, nothing pushed
    assert await ca.try_next_event("delivered", timeout=0.5) is None
    await cb.delivered(conv, 99)  # clamped to what exists (3): nothing moves
    assert await ca.try_next_event("delivered", timeout=0.5) is None
    await ca.send(conv, "m3")
    await cb.delivered(conv, 99)
    ev = await ca.next_event("delivered")
    assert ev["seq"] == 4
    await _persisted(alice, conv, 4)
    st = {s["conv_id"]: s for s in await alice.conversations()}[conv]
    assert st["peer_delivered_seq"] == 4 and st["peer_read_seq"] == 0
    for c in (ca, cb):
        await c.close()


async def test_read_refusals(url: str, pair: tuple[Client, Client, str]) -> None:
    alice, _, conv = pair
    eve = await new_user(url, "eve")
    with pytest.raises(ApiError) as e:
        await eve.read_rest(conv, 1)
    assert e.value.status == 403 and e.value.code == "not_member"
    for bad in (-1, "x", 1.5, None, True):
        with pytest.raises(ApiError) as e:
            await alice.request("POST", f"/v1/conversations/{conv}/read", json={"seq": bad})
        assert e.value.status in (400, 422)
    ce = await eve.connect()
    await ce.read(conv, 1)
    ev = await ce.next_event("error")
    assert ev["code"] == "not_member"
    await ce.send_raw('{"type":"read","conv_id":"' + conv + '","seq":-5}')
    assert (await ce.next_event("error"))["code"] == "bad_request"
    await ce.ping()
    await ce.close()


async def test_unread_rules_single_chat(url: str) -> None:
    a, b = await new_user(url), await new_user(url)
    conv = await befriend(a, b)
    ca, cb = await a.connect(), await b.connect()
    # a new friend's first messages: unread for the receiver, not for the sender
    for i in range(3):
        await ca.send(conv, f"a{i}")
    await _persisted(b, conv, 3)
    assert await _unread(b, conv) == 3
    assert await _unread(a, conv) == 0
    # the fallback: my last sent seq stands in for a cursor I never reported
    await cb.send(conv, "b0")  # seq 4
    await _persisted(b, conv, 4)
    assert await _unread(b, conv) == 0
    assert await _unread(a, conv) == 1
    for i in range(2):
        await ca.send(conv, f"a{3 + i}")  # seqs 5, 6
    await _persisted(b, conv, 6)
    assert await _unread(b, conv) == 2
    # an explicit cursor wins over the fallback, even when older; my own messages never count
    await b.read_rest(conv, 2)
    assert await _unread(b, conv) == 3  # seqs 3, 5, 6 (4 is mine)
    # sending does not move my cursor
    await cb.send(conv, "b1")  # seq 7
    await _persisted(b, conv, 7)
    st = {s["conv_id"]: s for s in await b.conversations()}[conv]
    assert st["read_seq"] == 2 and st["unread"] == 3
    # total and the per-conversation list only hold conversations with unread > 0
    u = await b.unread()
    assert u["total"] >= 3 and all(x["unread"] > 0 for x in u["conversations"])
    await b.read_rest(conv, 7)
    assert await _unread(b, conv) == 0
    assert conv not in {x["conv_id"] for x in (await b.unread())["conversations"]}
    # clearing: nothing before the clear point counts
    await ca.send(conv, "a5")  # seq 8
    await _persisted(b, conv, 8)
    assert await _unread(b, conv) == 1
    await b.clear(conv)
    assert await _unread(b, conv) == 0
    await ca.send(conv, "a6")  # seq 9
    await _persisted(b, conv, 9)
    assert await _unread(b, conv) == 1
    for c in (ca, cb):
        await c.close()


async def test_unread_recall_notices_never_count(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca = await alice.connect()
    ack = await ca.send(conv, "oops")
    await _persisted(bob, conv, ack["seq"])
    await alice.recall(conv, ack["seq"])
    await _persisted(bob, conv, ack["seq"] + 1)
    assert await _unread(bob, conv) == 1  # the original, blanked, still counts; the notice does not
    await ca.close()


async def test_unread_kicked_window(url: str) -> None:
    owner, m1 = await new_user(url), await new_user(url)
    g = await owner.create_group("kick", [m1.user_id])
    conv = g["conv_id"]
    co = await owner.connect()
    for i in range(3):
        await co.send(conv, f"before{i}")
    await _persisted(m1, conv, 3)
    assert await _unread(m1, conv) == 3
    await owner.kick(g["group_id"], m1.user_id)
    for i in range(4):
        await co.send(conv, f"after{i}")
    await _persisted(owner, conv, 8)  # 3 + kick notice + 4
    assert await _unread(m1, conv) == 3, (
        "nothing after the kick is visible, so none of it is unread"
    )
    res = await m1.read_rest(conv, 100)
    assert res["read_seq"] == 3, "the cursor is clamped to the window's end"
    assert await _unread(m1, conv) == 0
    await co.close()


async def test_group_receipts_and_pushes(url: str) -> None:
    owner = await new_user(url)
    ms = [await new_user(url) for _ in range(3)]
    g = await owner.create_group("receipts", [m.user_id for m in ms])
    conv = g["conv_id"]
    co = await owner.connect()
    ack = await co.send(conv, "did you read this?")
    seq = ack["seq"]
    await _persisted(owner, conv, seq)
    r = await owner.receipts(conv, seq)
    assert r == {"seq": seq, "read_count": 0, "member_count": 3, "readers": []}
    await ms[0].read_rest(conv, seq)
    await ms[1].read_rest(conv, seq)
    r = await owner.receipts(conv, seq)
    assert r["read_count"] == 2 and r["member_count"] == 3
    assert sorted(r["readers"]) == sorted([ms[0].user_id, ms[1].user_id])
    ev = await co.next_event("receipt", timeout=5)
    assert ev["conv_id"] == conv and ev["seq"] == seq and 1 <= ev["read_count"] <= 2
    # batched: the two reads arrive as at most two pushes, the last one with the full count
    while ev["read_count"] < 2:
        ev = await co.next_event("receipt", timeout=5)
    assert ev["read_count"] == 2
    await co.close()


async def test_typing_reaches_the_others(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    a1, a2, b1 = await alice.connect(), await alice.connect(), await bob.connect()
    await a1.typing(conv)
    ev = await b1.next_event("typing")
    assert ev == {"type": "typing", "conv_id": conv, "user_id": alice.user_id}
    assert await a2.try_next_event("typing", timeout=0.4) is None
    for c in (a1, a2, b1):
        await c.close()
