"""The send pipeline: dense seqs, dedupe, pushes to every device, the REST twin,
refusals, and bad frames that never cost the connection."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from im_server.client import ApiError, Client
from im_server.storage.redis import keys as redis_keys
from tests.support import Stores, befriend, new_user, persisted, rds


async def test_dense_seqs_under_concurrent_senders(url: str) -> None:
    owner = await new_user(url)
    others = [await new_user(url) for _ in range(3)]
    g = await owner.create_group("dense", [o.user_id for o in others])
    conv = g["conv_id"]
    conns = [await c.connect() for c in (owner, *others)]
    futs = [await conn.send_nowait(conv, f"m{i}") for i in range(50) for conn in conns]
    acks = await asyncio.gather(*futs)
    assert all(a["ok"] for a in acks)
    seqs = sorted(a["seq"] for a in acks)
    assert seqs == list(range(1, len(acks) + 1)), "seqs must be dense, unique, from 1"
    for conn in conns:
        await conn.close()


async def test_duplicate_send_returns_first_ack(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca = await alice.connect()
    cmid = uuid.uuid4().hex
    first = await ca.send(conv, "once", client_msg_id=cmid)
    again = await ca.send(conv, "once", client_msg_id=cmid)
    rest = await alice.send_rest(conv, "once", client_msg_id=cmid)
    assert first["duplicate"] is False
    for dup in (again, rest):
        assert dup["duplicate"] is True
        assert (dup["seq"], dup["conv_id"], dup["server_time"]) == (
            first["seq"],
            conv,
            first["server_time"],
        )

    # a send after the repeats gets the very next seq (no repeat took one), and once it
    # is persisted so is everything queued before it: the message is there once
    after = uuid.uuid4().hex
    nxt = await alice.send_rest(conv, "after", client_msg_id=after)
    assert nxt["ok"] is True and nxt["seq"] == first["seq"] + 1, nxt
    await persisted(bob, conv, nxt["seq"])
    msgs = (await bob.history(conv))["messages"]
    assert [m["client_msg_id"] for m in msgs] == [cmid, after]
    await ca.close()


async def test_concurrent_duplicates_yield_one_message(pair: tuple[Client, Client, str]) -> None:
    alice, _, conv = pair
    conns = [await alice.connect() for _ in range(3)]
    cmid = uuid.uuid4().hex
    futs = [await c.send_nowait(conv, "race", client_msg_id=cmid) for c in conns for _ in range(5)]
    acks = await asyncio.gather(*futs)
    assert {a["seq"] for a in acks} == {acks[0]["seq"]}
    assert sum(1 for a in acks if not a["duplicate"]) == 1
    for c in conns:
        await c.close()


async def test_push_reaches_every_other_device(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    a1, a2 = await alice.connect(), await alice.connect()
    b1, b2 = await bob.connect(), await bob.connect()
    ack = await a1.send(conv, "to all devices")
    for dev in (a2, b1, b2):
        ev = await dev.next_event("message")
        assert ev["message"]["seq"] == ack["seq"] and ev["message"]["sender_id"] == alice.user_id
    # the sending device gets the ack, not an echo of its own message
    assert await a1.try_next_event("message", timeout=0.5) is None
    for c in (a1, a2, b1, b2):
        await c.close()


async def test_rest_send_same_ack_and_push(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    a1, b1 = await alice.connect(), await bob.connect()
    ack = await alice.send_rest(conv, "over REST")
    assert set(ack) >= {"type", "client_msg_id", "ok", "conv_id", "seq", "server_time", "duplicate"}
    assert ack["ok"] is True and ack["type"] == "ack"
    for dev in (a1, b1):  # a REST send reaches every device, the sender's too
        ev = await dev.next_event("message")
        assert ev["message"]["seq"] == ack["seq"]
    await a1.close()
    await b1.close()


async def test_outsider_cannot_send(url: str, pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    eve = await new_user(url, "eve")
    ce = await eve.connect()
    refused = await ce.send(conv, "let me in")
    assert refused["ok"] is False and refused["code"] == "not_member"
    with pytest.raises(ApiError) as err:
        await eve.send_rest(conv, "let me in")
    assert err.value.status == 403 and err.value.code == "not_member"
    g = await alice.create_group("private", [bob.user_id])
    refused = await ce.send(g["conv_id"], "hi group")
    assert refused["ok"] is False and refused["code"] == "not_member"
    # nothing was stored: the next legitimate send is seq 1, and alone once persisted
    cmid = uuid.uuid4().hex
    ack = await alice.send_rest(conv, "first", client_msg_id=cmid)
    assert ack["ok"] is True and ack["seq"] == 1, ack
    await persisted(alice, conv, 1)
    assert [m["client_msg_id"] for m in (await alice.history(conv))["messages"]] == [cmid]
    await ce.close()


async def test_strangers_are_not_friends(url: str) -> None:
    a, b = await new_user(url), await new_user(url)
    conv = f"s:{min(a.user_id, b.user_id)}:{max(a.user_id, b.user_id)}"
    ca = await a.connect()
    refused = await ca.send(conv, "hello stranger")
    assert refused["ok"] is False and refused["code"] == "not_friends"
    await befriend(a, b)
    ok = await ca.send(conv, "hello friend")
    assert ok["ok"] is True and ok["seq"] == 1
    await ca.close()


async def test_bad_frames_get_errors_and_keep_the_connection(
    pair: tuple[Client, Client, str],
) -> None:
    alice, _, conv = pair
    ca = await alice.connect()
    for raw in ("not json", "[1,2]", '{"no":"type"}', '{"type":"teleport"}', '{"type":7}', "{"):
        await ca.send_raw(raw)
        ev = await ca.next_event("error")
        assert ev["code"] == "bad_request" and ev["message"]
    bad_sends = [
        {"type": "send", "conv_id": conv, "content": {"text": "x"}},  # no client_msg_id
        {"type": "send", "conv_id": conv, "client_msg_id": "bad id!", "content": {"text": "x"}},
        {"type": "send", "conv_id": "s:2:1", "client_msg_id": "ok1", "content": {"text": "x"}},
        {"type": "send", "conv_id": conv, "client_msg_id": "ok2", "content": "not an object"},
        {
            "type": "send",
            "conv_id": conv,
            "client_msg_id": "ok3",
            "content_type": "system",
            "content": {},
        },
        {"type": "send", "conv_id": conv, "client_msg_id": "ok4", "content": {"text": ""}},
    ]
    import orjson

    for frame in bad_sends:
        await ca.send_raw(orjson.dumps(frame).decode())
        ev = await ca.next_event("ack")
        assert ev["ok"] is False and ev["code"] == "bad_request", frame
    big = {"text": "x" * (16 * 1024 + 1)}
    refused = await ca.send(conv, big)
    assert refused["ok"] is False and refused["code"] == "too_large"
    await ca.ping()
    ok = await ca.send(conv, "still here")
    assert ok["ok"] is True and ok["seq"] == 1, "refused sends must not use seqs"
    await ca.close()


async def test_oversize_frame_closes_1009(pair: tuple[Client, Client, str]) -> None:
    alice, _, _ = pair
    ca = await alice.connect()
    await ca.send_raw("x" * (64 * 1024 + 10))
    assert await ca.wait_closed(5) == 1009
    # a fresh connection works
    cb = await alice.connect()
    await cb.ping()
    await cb.close()


async def test_a_seq_counter_of_another_run_is_not_trusted(
    stores: Stores, pair: tuple[Client, Client, str]
) -> None:
    """The send script marks a conversation's counter with the run id of the node that
    runs it, read there (on a Cluster every partition's node has its own). A counter
    marked by another run (what a replica promoted by a fail-over holds: the old
    primary's mark, maybe without its last increments) is not used: the next send
    reserves a fresh block above every seq reserved before."""
    alice, _bob, conv = pair
    ca = await alice.connect()
    first = await ca.send(conv, "before")
    assert first["ok"], first
    key = redis_keys.seq(0, conv)  # one partition: p0
    async with rds(stores) as r:
        run_id = (await r.info("server"))["run_id"]
        counter = await r.hgetall(key)
        assert counter["rid"] == run_id and int(counter["cur"]) == first["seq"], counter
        await r.hset(key, "rid", "f" * 40)  # the mark of another run
    after = await ca.send(conv, "after the fail-over")
    assert after["ok"], after
    assert after["seq"] > int(counter["lim"]), (after["seq"], counter)
    async with rds(stores) as r:
        assert (await r.hget(key, "rid")) == run_id
    await persisted(alice, conv, after["seq"])
    for seq in (first["seq"], after["seq"]):
        page = await alice.history(conv, seq, seq)
        assert [m["seq"] for m in page["messages"]] == [seq], page
    await ca.close()
