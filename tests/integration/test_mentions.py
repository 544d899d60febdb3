"""Mentions and replies against the contract (PROTOCOL.md "Mentions, replies, edits,
reactions", ``mention_unread`` under "Conversation settings"): who may mention whom,
what the message carries on every read path (push, history, sync, conversation state),
``mention_unread`` counted by the unread rules from the same single statement, and which
``reply_to`` seqs a sender may name."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pytest
from sqlalchemy import event

from im_server.client import ApiError, Client
from im_server.config import Settings
from im_server.storage import conv_states
from im_server.storage.db import create_engine
from tests.support import Make, Stores, befriend, pg_dsn
from tests.support import persisted as _persisted


async def _group(make: Make, n_members: int = 3) -> tuple[Client, Client, list[Client], int, str]:
    """owner, admin, plain members, group id, conv id."""
    owner, adm = await make("own"), await make("adm")
    ms = [await make(f"m{i}") for i in range(n_members)]
    g = await owner.create_group("mentions", [adm.user_id, *(m.user_id for m in ms)])
    gid = int(g["group_id"])
    await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{adm.user_id}/role", json={"role": "admin"}
    )
    return owner, adm, ms, gid, str(g["conv_id"])


async def _expect(call: Awaitable[Any], status: int, code: str) -> None:
    with pytest.raises(ApiError) as ei:
        await call
    assert (ei.value.status, ei.value.code) == (status, code), ei.value


async def _state(c: Client, conv: str) -> dict[str, Any]:
    states = {s["conv_id"]: s for s in await c.conversations()}
    return states[conv]


async def _mention_unread(c: Client, conv: str) -> tuple[int, int]:
    """(unread, mention_unread) of the conversation state, checked against GET /v1/unread
    and against a sync's state."""
    st = await _state(c, conv)
    listed = {x["conv_id"]: x for x in (await c.unread())["conversations"]}
    item = listed.get(conv, {"unread": 0, "mention_unread": 0})
    assert (item["unread"], item["mention_unread"]) == (st["unread"], st["mention_unread"])
    synced = await c.sync(0)
    sst = {s["conv_id"]: s for s in synced["conversations"]}.get(conv)
    if sst is not None:
        assert sst["mention_unread"] == st["mention_unread"], sst
    return int(st["unread"]), int(st["mention_unread"])


def _fields(m: dict[str, Any]) -> tuple[list[int], bool, int | None]:
    return m["mentions"], m["mention_all"], m["reply_to"]


async def _history_msg(c: Client, conv: str, seq: int) -> dict[str, Any]:
    page = await c.history(conv, begin=seq, end=seq)
    assert [m["seq"] for m in page["messages"]] == [seq], page
    return dict(page["messages"][0])


# -- who may mention whom ------------------------------------------------------------------


async def test_mentions_travel_on_every_read_path(make: Make, url: str) -> None:
    owner, adm, (m0, m1, m2), _gid, conv = await _group(make)
    outsider = await make("out")
    listen = await m1.connect()
    co = await owner.connect()
    # duplicates collapse, non-members are dropped silently, the rest ascending
    ask = [m2.user_id, m1.user_id, outsider.user_id, m1.user_id, 2**62 + 5]
    ack = await co.send(conv, "hi you two", mentions=ask)
    assert ack["ok"] is True, ack
    seq = int(ack["seq"])
    want = (sorted([m1.user_id, m2.user_id]), False, None)
    push = await listen.next_event("message", predicate=lambda f: f["message"]["seq"] == seq)
    assert _fields(push["message"]) == want, push
    await _persisted(owner, conv, seq)
    assert _fields(await _history_msg(m0, conv, seq)) == want
    synced = await m2.sync(0)
    found = [m for m in synced["conversations"] if m["conv_id"] == conv][0]
    assert _fields(found["messages"][-1]) == want, found
    last = (await _state(m0, conv))["last_message"]
    assert _fields(last) == want, last
    # a plain send carries the empty fields
    plain = await co.send(conv, "plain")
    push = await listen.next_event(
        "message", predicate=lambda f: f["message"]["seq"] == plain["seq"]
    )
    assert _fields(push["message"]) == ([], False, None)
    # over REST too, with a reply
    ack = await adm.send_rest(conv, "re", mentions=[owner.user_id], reply_to=seq)
    push = await listen.next_event("message", predicate=lambda f: f["message"]["seq"] == ack["seq"])
    assert _fields(push["message"]) == ([owner.user_id], False, seq)
    await _persisted(owner, conv, int(ack["seq"]))
    assert _fields(await _history_msg(m1, conv, int(ack["seq"]))) == ([owner.user_id], False, seq)
    await listen.close()
    await co.close()


async def test_mention_all_needs_owner_or_admin(make: Make) -> None:
    owner, adm, (m0, _m1, _m2), _gid, conv = await _group(make)
    c0 = await m0.connect()
    ack = await c0.send(conv, "everyone!", mention_all=True)
    assert ack["ok"] is False and ack["code"] == "forbidden", ack
    await _expect(m0.send_rest(conv, "everyone!", mention_all=True), 403, "forbidden")
    for who in (owner, adm):
        ack = await who.send_rest(conv, "everyone", mention_all=True)
        assert ack["ok"] is True, ack
        await _persisted(m0, conv, int(ack["seq"]))
        assert _fields(await _history_msg(m0, conv, int(ack["seq"]))) == ([], True, None)
    # nothing was stored for the refused ones: seqs 1 and 2 are the two accepted sends
    assert (await m0.history(conv))["max_seq"] == 2
    await c0.close()


async def test_mentions_in_a_single_chat_are_refused(make: Make) -> None:
    a, b = await make("a"), await make("b")
    conv = await befriend(a, b)
    ca = await a.connect()
    for extra in ({"mentions": [b.user_id]}, {"mention_all": True}):
        ack = await ca.send(conv, "hey", **extra)
        assert ack["ok"] is False and ack["code"] == "bad_request", ack
        await _expect(a.send_rest(conv, "hey", **extra), 400, "bad_request")
    # an empty list is no mention at all, and a reply works in a single chat
    first = await ca.send(conv, "one", mentions=[])
    assert first["ok"] is True, first
    ack = await b.send_rest(conv, "two", reply_to=int(first["seq"]))
    assert ack["ok"] is True, ack
    await ca.close()


async def test_a_kicked_member_is_neither_mentioned_nor_counted(make: Make) -> None:
    owner, _adm, (m0, m1, _m2), gid, conv = await _group(make)
    s1 = await owner.send_rest(conv, "before", mentions=[m0.user_id])
    await _persisted(m0, conv, int(s1["seq"]))
    assert await _mention_unread(m0, conv) == (1, 1)
    await owner.kick(gid, m0.user_id)
    s2 = await owner.send_rest(conv, "after", mentions=[m0.user_id, m1.user_id])
    s3 = await owner.send_rest(conv, "all after", mention_all=True)
    await _persisted(owner, conv, int(s3["seq"]))
    assert _fields(await _history_msg(m1, conv, int(s2["seq"]))) == ([m1.user_id], False, None)
    assert await _mention_unread(m0, conv) == (1, 1), "nothing after the kick counts"
    # the kicked member can mention nobody any more
    await _expect(m0.send_rest(conv, "me?", mentions=[m1.user_id]), 403, "not_member")


# -- mention_unread --------------------------------------------------------------------------


async def test_mention_unread_counts_exactly(make: Make) -> None:
    owner, adm, (m0, m1, _m2), _gid, conv = await _group(make)
    assert await _mention_unread(m0, conv) == (0, 0)
    seqs = []
    for who, kw in (
        (owner, {"mentions": [m0.user_id]}),  # counts
        (adm, {"mentions": [m1.user_id]}),  # someone else: unread, not a mention
        (owner, {"mention_all": True}),  # counts
        (m1, {}),  # plain
        (m0, {"mentions": [m0.user_id]}),  # my own: never unread
    ):
        seqs.append(int((await who.send_rest(conv, "x", **kw))["seq"]))
    await _persisted(m0, conv, seqs[-1])
    # my own send is the COALESCE fallback cursor: nothing before it is unread
    assert await _mention_unread(m0, conv) == (0, 0)
    s6 = int((await owner.send_rest(conv, "y", mentions=[m0.user_id, m1.user_id]))["seq"])
    await adm.send_rest(conv, "z", mention_all=True)
    s8 = int((await owner.send_rest(conv, "w"))["seq"])
    await _persisted(m0, conv, s8)
    assert await _mention_unread(m0, conv) == (3, 2)
    assert await _mention_unread(m1, conv) == (4, 2)  # m1: no cursor, sent seq 4
    # a recall notice is a notice: never unread, never a mention
    await owner.recall(conv, s6)
    await _persisted(m0, conv, s8 + 1)
    u, n = await _mention_unread(m0, conv)
    assert (u, n) == (3, 2), "the recalled original still counts, the notice does not"
    # the read cursor
    await m0.read_rest(conv, s6)
    assert await _mention_unread(m0, conv) == (2, 1)
    await m0.read_rest(conv, s8 + 1)
    assert await _mention_unread(m0, conv) == (0, 0)
    # clear: the window starts after the end, nothing before counts
    await m1.clear(conv)
    assert await _mention_unread(m1, conv) == (0, 0)
    s10 = int((await owner.send_rest(conv, "after clear", mention_all=True))["seq"])
    await _persisted(m1, conv, s10)
    assert await _mention_unread(m1, conv) == (1, 1)


async def test_mention_unread_of_a_late_joiner_starts_at_its_window(make: Make) -> None:
    owner, _adm, _ms, gid, conv = await _group(make, 1)
    late = await make("late")
    s1 = int((await owner.send_rest(conv, "old", mention_all=True))["seq"])
    await _persisted(owner, conv, s1)
    await owner.add_members(gid, [late.user_id])  # without history
    assert await _mention_unread(late, conv) == (0, 0)
    s3 = int((await owner.send_rest(conv, "new", mentions=[late.user_id]))["seq"])
    await _persisted(late, conv, s3)
    assert await _mention_unread(late, conv) == (1, 1)


async def test_unread_and_mention_unread_come_from_one_statement(
    make: Make, stores: Stores
) -> None:
    owner, _adm, (m0, _m1, _m2), _gid, conv = await _group(make)
    for kw in ({"mentions": [m0.user_id]}, {"mention_all": True}, {}):
        s = int((await owner.send_rest(conv, "x", **kw))["seq"])
    await _persisted(m0, conv, s)
    engine = create_engine(Settings(database_url=pg_dsn(stores), redis_url="redis://x"))
    sent: list[str] = []

    def count(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")  # the connection's own set-up
            sent.clear()
            counts = await conv_states.unread_counts(conn, m0.user_id)
            assert len(sent) == 1, sent
            assert (conv, 3, 2) in counts, counts
            sent.clear()
            states = await conv_states.states(conn, m0.user_id, conv_ids=[conv])
            assert len(sent) == 1, sent
            assert (states[0]["unread"], states[0]["mention_unread"]) == (3, 2)
    finally:
        await engine.dispose()


# -- reply_to --------------------------------------------------------------------------------


async def test_reply_to_must_be_in_my_window(make: Make) -> None:
    owner, _adm, (m0, m1, _m2), gid, conv = await _group(make)
    s1 = int((await owner.send_rest(conv, "one"))["seq"])
    s2 = int((await owner.send_rest(conv, "two"))["seq"])
    # a seq handed out but maybe not stored yet is fine; beyond the end is not
    ack = await m0.send_rest(conv, "re two", reply_to=s2)
    assert ack["ok"] is True and ack["seq"] == s2 + 1, ack
    end = s2 + 1
    c0 = await m0.connect()
    bad = await c0.send(conv, "future", reply_to=end + 1)
    assert bad["ok"] is False and bad["code"] == "bad_request", bad
    await _expect(m0.send_rest(conv, "future", reply_to=10**12), 400, "bad_request")
    # after a clear, what was before it is out of my window
    await _persisted(m0, conv, end)
    await m0.clear(conv)
    await _expect(m0.send_rest(conv, "re one", reply_to=s1), 400, "bad_request")
    bad = await c0.send(conv, "re one", reply_to=s1)
    assert bad["ok"] is False and bad["code"] == "bad_request", bad
    assert (await m1.send_rest(conv, "re one", reply_to=s1))["ok"] is True
    # a member joined without history cannot answer what came before
    late = await make("late")
    await owner.add_members(gid, [late.user_id])
    await _expect(late.send_rest(conv, "re", reply_to=s2), 400, "bad_request")
    # after a kick, nothing: not a member any more
    await owner.kick(gid, m1.user_id)
    await _expect(m1.send_rest(conv, "re", reply_to=s1), 403, "not_member")
    await c0.close()


async def test_refused_extras_change_nothing(make: Make) -> None:
    owner, _adm, (m0, _m1, _m2), _gid, conv = await _group(make)
    s1 = int((await owner.send_rest(conv, "one"))["seq"])
    await _persisted(owner, conv, s1)
    c0 = await m0.connect()
    for kw in (
        {"mention_all": True},
        {"reply_to": 99},
        {"mentions": [owner.user_id], "reply_to": 0},
    ):
        ack = await c0.send(conv, "no", client_msg_id=f"r{len(kw)}{kw.get('reply_to')}", **kw)
        assert ack["ok"] is False, ack
    ok = await owner.send_rest(conv, "two")
    assert ok["seq"] == s1 + 1, "no seq was taken by the refused sends"
    await c0.close()


async def test_a_repeat_answers_the_first_ack_even_once_its_checks_would_refuse(
    make: Make,
) -> None:
    """A device that missed the ack of a send with mentions and a reply repeats it after
    the sender was kicked: it gets the first ack (duplicate), not a refusal of a message
    that exists; over REST and over the WebSocket."""
    owner, adm, (m0, m1, _m2), gid, conv = await _group(make)
    first = int((await owner.send_rest(conv, "the original"))["seq"])
    c0 = await m0.connect()
    kw: dict[str, Any] = {"mentions": [m1.user_id], "reply_to": first}
    ws_ack = await c0.send(conv, "over ws", client_msg_id="rep-ws", **kw)
    rest_ack = await m0.send_rest(conv, "over rest", client_msg_id="rep-rest", **kw)
    assert ws_ack["ok"] is True and rest_ack["ok"] is True, (ws_ack, rest_ack)
    await owner.kick(gid, m0.user_id)
    # a new send with the same extras is refused now ...
    refused = await c0.send(conv, "new", client_msg_id="rep-new", **kw)
    assert refused["ok"] is False and refused["code"] == "not_member", refused
    # ... but the repeats answer what the first sends got
    again = await c0.send(conv, "over ws", client_msg_id="rep-ws", **kw)
    assert (again["ok"], again["seq"], again["duplicate"]) == (True, ws_ack["seq"], True), again
    again_rest = await m0.send_rest(conv, "over rest", client_msg_id="rep-rest", **kw)
    assert (again_rest["seq"], again_rest["duplicate"]) == (rest_ack["seq"], True), again_rest
    # the repeats took no seq
    nxt = await adm.send_rest(conv, "next")
    assert nxt["seq"] == rest_ack["seq"] + 2, "one seq for the kick notice, none for repeats"
    await c0.close()


async def test_sends_of_one_socket_get_seqs_in_sending_order(make: Make) -> None:
    """A send that mentions or replies is checked against the store before it is queued;
    plain sends written right after it on the same socket wait for it, so the seqs
    follow the order the device sent them in."""
    owner, _adm, (m0, m1, _m2), _gid, conv = await _group(make)
    first = int((await owner.send_rest(conv, "the original"))["seq"])
    c0 = await m0.connect()
    order: list[str] = []
    futs = []
    for i in range(12):
        extra: dict[str, Any] = {}
        if i % 4 == 0:
            extra = {"reply_to": first, "mentions": [m1.user_id]}
        cmid = f"ord-{i}"
        order.append(cmid)
        futs.append(await c0.send_nowait(conv, f"m{i}", client_msg_id=cmid, **extra))
    acks = [await f for f in futs]
    assert all(a["ok"] for a in acks), acks
    seqs = [int(a["seq"]) for a in acks]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), list(zip(order, seqs, strict=True))
    await c0.close()
