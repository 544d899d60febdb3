"""Groups against the contract (PROTOCOL.md "Groups", "Conversations, history, read
state", seed 002): roles, membership notices in the seq stream, and each member's
visibility window seen through every read path (history, conversation state, unread,
receipts), recall, and the seed's "conversation min and my min both 100" question."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import asyncpg
import pytest

from im_server.client import ApiError, Client, group_conv_id
from im_server.client.transport import HttpPool
from tests.support import PASSWORD, Make, ServerProcess, Stores, eventually, new_user, pg
from tests.support import persisted as _persisted
from tests.support import send_ok as _send

UNKNOWN_GROUP = 2**62 + 777


async def _api_error(call: Awaitable[Any]) -> ApiError:
    with pytest.raises(ApiError) as ei:
        await call
    return ei.value


async def _expect(call: Awaitable[Any], status: int, code: str) -> None:
    err = await _api_error(call)
    assert (err.status, err.code) == (status, code), err


def _seqs(page: dict[str, Any]) -> list[int]:
    return [m["seq"] for m in page["messages"]]


async def _state(c: Client, conv: str) -> dict[str, Any]:
    states = {s["conv_id"]: s for s in await c.conversations()}
    assert conv in states, (c, list(states))
    return states[conv]


async def _unread(c: Client, conv: str) -> int:
    """Unread from GET /v1/unread, checked against the conversation state."""
    listed = {x["conv_id"]: x["unread"] for x in (await c.unread())["conversations"]}
    st = await _state(c, conv)
    assert listed.get(conv, 0) == st["unread"], (listed, st)
    return int(st["unread"])


async def _refused(c: Client, conv: str, code: str) -> None:
    """Both the WebSocket ack and the REST send refuse with ``code``."""
    conn = await c.connect()
    try:
        ack = await conn.send(conv, "should be refused")
    finally:
        await conn.close()
    assert ack["ok"] is False and ack["code"] == code, ack
    await _expect(c.send_rest(conv, "should be refused too"), 403, code)


def _roles(members: list[dict[str, Any]]) -> dict[int, str]:
    return {int(m["user_id"]): m["role"] for m in members}


# -- creation and roles --------------------------------------------------------------------


async def test_create_group(make: Make) -> None:
    owner, b, c = await make("own"), await make("b"), await make("c")
    g = await owner.create_group("team", [b.user_id, c.user_id])
    gid, conv = g["group_id"], g["conv_id"]
    assert isinstance(gid, int) and gid > 0 and conv == group_conv_id(gid) == f"g:{gid}"
    assert _roles(await owner.members(gid)) == {
        owner.user_id: "owner",
        b.user_id: "member",
        c.user_id: "member",
    }
    assert _roles(await b.members(gid)) == _roles(await owner.members(gid))
    # creating posts no system message: the first user message is seq 1
    page = await owner.history(conv)
    assert page["messages"] == [] and page["max_seq"] == 0, page
    assert await _send(b, conv, "first") == 1
    await _persisted(owner, conv, 1)
    st = await _state(c, conv)
    assert st["type"] == "group" and st["group_id"] == gid and st["name"] == "team", st
    assert st["min_seq"] == 1 and st["max_seq"] == 1 and st["unread"] == 1, st

    await _expect(owner.create_group("x", [UNKNOWN_GROUP]), 404, "not_found")
    err = await _api_error(owner.create_group("", [b.user_id]))
    assert err.status in (400, 422), err


async def test_role_rules(make: Make) -> None:
    owner, adm, m1, m2, m3 = [await make(p) for p in ("own", "adm", "m1", "m2", "m3")]
    outsider, newbie = await make("out"), await make("new")
    gid = (await owner.create_group("roles", [adm.user_id, m1.user_id, m2.user_id, m3.user_id]))[
        "group_id"
    ]
    conv = group_conv_id(gid)

    # a plain member can neither add, kick nor change roles
    await _expect(m1.add_members(gid, [newbie.user_id]), 403, "forbidden")
    await _expect(m1.kick(gid, m2.user_id), 403, "forbidden")
    await _expect(
        m1.request("PUT", f"/v1/groups/{gid}/members/{m2.user_id}/role", json={"role": "admin"}),
        403,
        "forbidden",
    )

    # the owner sets roles
    res = await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{adm.user_id}/role", json={"role": "admin"}
    )
    assert res["role"] == "admin", res
    assert _roles(await owner.members(gid))[adm.user_id] == "admin"
    err = await _api_error(
        owner.request("PUT", f"/v1/groups/{gid}/members/{m1.user_id}/role", json={"role": "king"})
    )
    assert err.status in (400, 422), err

    # an admin adds and kicks members, but may not change roles
    await adm.add_members(gid, [newbie.user_id])
    assert _roles(await owner.members(gid))[newbie.user_id] == "member"
    await adm.kick(gid, m2.user_id)
    assert m2.user_id not in _roles(await owner.members(gid))
    await _expect(
        adm.request("PUT", f"/v1/groups/{gid}/members/{m1.user_id}/role", json={"role": "admin"}),
        403,
        "forbidden",
    )
    # ... nor kick the owner or another admin
    await _expect(adm.kick(gid, owner.user_id), 403, "forbidden")
    await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{m3.user_id}/role", json={"role": "admin"}
    )
    await _expect(adm.kick(gid, m3.user_id), 403, "forbidden")
    # the owner can demote and kick an admin
    await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{m3.user_id}/role", json={"role": "member"}
    )
    assert _roles(await owner.members(gid))[m3.user_id] == "member"
    await owner.kick(gid, adm.user_id)
    assert _roles(await owner.members(gid)) == {
        owner.user_id: "owner",
        m1.user_id: "member",
        m3.user_id: "member",
        newbie.user_id: "member",
    }
    # the kicked admin lost its powers with its membership
    await _expect(adm.add_members(gid, [outsider.user_id]), 403, "not_member")

    # an outsider: not_member everywhere; an unknown group: 404
    await _expect(outsider.members(gid), 403, "not_member")
    await _expect(outsider.add_members(gid, [outsider.user_id]), 403, "not_member")
    await _expect(outsider.kick(gid, m1.user_id), 403, "not_member")
    await _expect(outsider.leave(gid), 403, "not_member")
    await _expect(outsider.history(conv), 403, "not_member")
    await _refused(outsider, conv, "not_member")
    await _expect(outsider.members(UNKNOWN_GROUP), 404, "not_found")
    await _expect(owner.members(UNKNOWN_GROUP), 404, "not_found")
    await _expect(owner.add_members(UNKNOWN_GROUP, [m1.user_id]), 404, "not_found")
    await _expect(owner.kick(UNKNOWN_GROUP, m1.user_id), 404, "not_found")


async def test_owner_leaving_hands_over(make: Make) -> None:
    owner, adm, mem = await make("own"), await make("adm"), await make("mem")
    gid = (await owner.create_group("handover", [mem.user_id, adm.user_id]))["group_id"]
    conv = group_conv_id(gid)
    await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{adm.user_id}/role", json={"role": "admin"}
    )
    assert await _send(owner, conv, "bye") == 1

    await owner.leave(gid)

    assert _roles(await mem.members(gid)) == {adm.user_id: "owner", mem.user_id: "member"}
    await _persisted(mem, conv, 2)
    notice = (await mem.history(conv))["messages"][-1]
    assert notice["seq"] == 2 and notice["content_type"] == "system", notice
    assert notice["content"]["event"] == "member_left", notice
    assert notice["content"]["actor"] == owner.user_id, notice
    assert notice["content"]["user_ids"] == [owner.user_id], notice
    # the old owner keeps what it saw, and nothing after
    page = await owner.history(conv)
    assert _seqs(page) == [1] and page["max_seq"] == 1, page
    await _refused(owner, conv, "not_member")
    await _expect(owner.members(gid), 403, "not_member")
    # the new owner has the owner's powers
    res = await adm.request(
        "PUT", f"/v1/groups/{gid}/members/{mem.user_id}/role", json={"role": "admin"}
    )
    assert res["role"] == "admin"
    # the last owner leaving hands over to whoever is left
    await adm.leave(gid)
    assert _roles(await mem.members(gid)) == {mem.user_id: "owner"}


# -- the four member kinds ---------------------------------------------------------------------


async def test_member_windows_through_every_read_path(make: Make) -> None:
    """One group, one seq stream, six members: the owner Own and a stayer S (whole
    stream), K kicked after seq 5, J joined without history, H joined with history, and
    R who left after seq 3 and was added again (with_history ignored on a re-join).

    seq  1 Own text   2 S text    3 K text    4 system member_left R
    seq  5 Own text   6 system member_kicked K     7 S text
    seq  8 system members_added J    9 Own text   10 system members_added H (history)
    seq 11 system members_added R   12 S text     13 H text    14 Own text

    The contract fixes the read cursor of a re-joined member (the end at re-join) but
    not that of a brand-new one, so J never reports (its window alone must keep 1-7 out
    of its unread) and H reports 9 explicitly.
    """
    Own, S, K, J, H, R = [await make(p) for p in ("own", "stay", "kick", "join", "hist", "rejoin")]
    o, s, k, j, h, r = (x.user_id for x in (Own, S, K, J, H, R))
    gid = (await Own.create_group("windows", [s, k, r]))["group_id"]
    conv = group_conv_id(gid)

    assert await _send(Own, conv, "m1") == 1
    assert await _send(S, conv, "m2") == 2
    assert await _send(K, conv, "m3") == 3
    await R.leave(gid)  # 4
    # while away, R reads what it saw and cannot send
    await _persisted(Own, conv, 4)
    away = await R.history(conv, begin=1, end=100)
    assert _seqs(away) == [1, 2, 3] and away["max_seq"] == 3, away
    assert (await _state(R, conv))["active"] is False
    await _refused(R, conv, "not_member")
    assert await _send(Own, conv, "m5") == 5
    assert (await K.read_rest(conv, 4))["read_seq"] == 4
    await Own.kick(gid, k)  # 6
    assert await _send(S, conv, "m7") == 7
    await Own.add_members(gid, [j], with_history=False)  # 8
    assert await _send(Own, conv, "m9") == 9
    await Own.add_members(gid, [h], with_history=True)  # 10
    assert (await H.read_rest(conv, 9))["read_seq"] == 9
    await Own.add_members(gid, [r], with_history=True)  # 11: a re-join ignores with_history
    assert await _send(S, conv, "m12") == 12
    assert await _send(H, conv, "m13") == 13
    assert await _send(Own, conv, "m14") == 14
    await _persisted(Own, conv, 14)

    assert _roles(await Own.members(gid)) == {
        o: "owner",
        s: "member",
        j: "member",
        h: "member",
        r: "member",
    }

    # system messages in the seq stream, with their event fields
    full = (await Own.history(conv, limit=200))["messages"]
    assert [m["seq"] for m in full] == list(range(1, 15))
    system = {m["seq"]: m for m in full if m["content_type"] == "system"}
    assert sorted(system) == [4, 6, 8, 10, 11], sorted(system)
    expect_events = {
        4: ("member_left", r, [r]),
        6: ("member_kicked", o, [k]),
        8: ("members_added", o, [j]),
        10: ("members_added", o, [h]),
        11: ("members_added", o, [r]),
    }
    for seq, (event, actor, users) in expect_events.items():
        c = system[seq]["content"]
        assert (c["event"], c["actor"], c["user_ids"]) == (event, actor, users), system[seq]
    assert system[8]["content"].get("with_history") in (False, None), system[8]
    assert system[10]["content"].get("with_history") in (True, None), system[10]

    windows = {Own: (1, 14), S: (1, 14), K: (1, 5), J: (8, 14), H: (1, 14), R: (11, 14)}
    active = {Own: True, S: True, K: False, J: True, H: True, R: True}

    # history: exactly the window, the bounds in the answer, clamped requests
    for who, (lo, hi) in windows.items():
        page = await who.history(conv, limit=200)
        assert _seqs(page) == list(range(lo, hi + 1)), (who, page)
        assert (page["min_seq"], page["max_seq"]) == (lo, hi), (who, page)
        wide = await who.history(conv, begin=1, end=1000, limit=200)
        assert _seqs(wide) == list(range(lo, hi + 1)), (who, wide)
        desc = await who.history(conv, begin=1, end=1000, order="desc", limit=200)
        assert _seqs(desc) == list(range(hi, lo - 1, -1)), (who, desc)
    # requests wholly outside a window: an empty list, not an error
    for who, b, e in ((K, 6, 14), (K, 7, 100), (J, 1, 7), (R, 1, 10), (R, 3, 3)):
        for order in ("asc", "desc"):
            page = await who.history(conv, begin=b, end=e, order=order)
            assert page["messages"] == [], (who, b, e, order, page)
            assert (page["min_seq"], page["max_seq"]) == windows[who], (who, page)

    # conversation states: window, active flag, the cursors new members start with
    for who, (lo, hi) in windows.items():
        st = await _state(who, conv)
        assert (st["min_seq"], st["max_seq"]) == (lo, hi), (who, st)
        assert st["active"] is active[who], (who, st)
        assert st["last_message"]["seq"] == hi, (who, st)
    assert (await _state(J, conv))["read_seq"] in (0, 7), "never reported: nothing or the end"
    assert (await _state(H, conv))["read_seq"] == 9
    assert (await _state(R, conv))["read_seq"] == 10
    assert (await _state(K, conv))["read_seq"] == 4

    # unread: others' user messages above my cursor and inside my window (membership
    # notices, like recall notices, are not counted)
    expected_unread = {
        Own: 0,  # never reported; cursor = my last sent (14)
        S: 2,  # cursor = my last sent (12): 13, 14
        K: 1,  # cursor 4, window ends at 5: 5 only (7, 9, 12, 13, 14 are after the kick)
        J: 4,  # no report; window starts at 8: 9, 12, 13, 14
        H: 2,  # cursor 9: 12, 14 (13 is mine)
        R: 3,  # cursor 10: 12, 13, 14 (its old window 1-3 is gone)
    }
    for who, n in expected_unread.items():
        assert await _unread(who, conv) == n, (who, await who.unread())

    # the kicked member cannot send, and cannot read past its window
    await _refused(K, conv, "not_member")
    try:
        moved = await K.read_rest(conv, 14)
    except ApiError as e:
        assert (e.status, e.code) == (403, "not_member"), e
    else:
        assert moved["read_seq"] == 5, moved
    assert (await _state(K, conv))["read_seq"] in (4, 5)
    assert await _unread(K, conv) in (0, 1)
    # receipts outside my window are not mine to ask about
    await _expect(K.receipts(conv, 9), 404, "not_found")
    await _expect(J.receipts(conv, 5), 404, "not_found")

    # receipts: member_count = members whose window contains seq, less the sender
    assert (await Own.read_rest(conv, 14))["read_seq"] == 14
    assert (await R.read_rest(conv, 12))["read_seq"] == 12
    k_cursor = (await _state(K, conv))["read_seq"]

    async def receipt(seq: int) -> tuple[int, int, set[int]]:
        rc = await Own.receipts(conv, seq)
        assert rc["seq"] == seq and rc["read_count"] == len(rc["readers"]), rc
        return rc["read_count"], rc["member_count"], set(rc["readers"])

    # seq 3 (K's): Own, S, H can see it; R's and J's cursors are past 3 but their windows
    # do not contain it
    assert await receipt(3) == (2, 3, {o, h})
    # seq 5 (Own's): S, K, H; K read it only if its late report was clamped to 5
    k_read_5 = {k} if k_cursor >= 5 else set()
    assert await receipt(5) == (1 + len(k_read_5), 3, {h} | k_read_5)
    # seq 9 (Own's): S, J, H; not K (kicked before), not R (away)
    assert await receipt(9) == (1, 3, {h})
    # seq 12 (S's): Own, J, H, R; K is out, whatever its cursor
    assert await receipt(12) == (2, 4, {o, r})
    # the same answer whoever asks
    assert await H.receipts(conv, 12) == await Own.receipts(conv, 12)

    # the new and the re-joined members can write; the kicked one still cannot
    assert await _send(J, conv, "m15") == 15
    assert await _send(R, conv, "m16") == 16
    await _refused(K, conv, "not_member")
    await _persisted(Own, conv, 16)
    assert _seqs(await K.history(conv)) == [1, 2, 3, 4, 5]
    assert _seqs(await R.history(conv)) == [11, 12, 13, 14, 15, 16]


# -- recall -----------------------------------------------------------------------------------


async def test_recall(make: Make) -> None:
    Own, S = await make("own"), await make("mem")
    gid = (await Own.create_group("recall", [S.user_id]))["group_id"]
    conv = group_conv_id(gid)
    dev = await S.connect()
    try:
        assert await _send(Own, conv, "oops") == 1
        assert await _send(S, conv, "mine") == 2
        await _persisted(Own, conv, 2)
        first = await dev.next_event("message", predicate=lambda f: f["message"]["seq"] == 1)
        assert first["message"]["content"] == {"text": "oops"}

        # a plain member may not recall someone else's message, and nothing changes (the
        # owner and admins may recall anyone's: test_moderation.py)
        await _expect(S.recall(conv, 1), 403, "forbidden")

        res = await Own.recall(conv, 1)
        assert res is not None
        frame = await dev.next_event(
            "message", predicate=lambda f: f["message"]["content_type"] == "recall"
        )
        notice = frame["message"]
        assert notice["content"] == {"seq": 1} and notice["sender_id"] == Own.user_id, notice
        assert notice["seq"] == 3 and notice["conv_id"] == conv, notice

        async def blanked() -> list[dict[str, Any]] | None:
            msgs = (await S.history(conv))["messages"]
            return msgs if len(msgs) == 3 and msgs[0]["recalled"] else None

        msgs = await eventually(blanked, timeout=15.0)
        assert [m["seq"] for m in msgs] == [1, 2, 3]
        assert msgs[0]["content"] is None and msgs[0]["recalled"] is True, msgs[0]
        assert msgs[0]["sender_id"] == Own.user_id and msgs[0]["content_type"] == "text"
        assert msgs[1]["content"] == {"text": "mine"} and msgs[1]["recalled"] is False
        assert msgs[2]["content_type"] == "recall" and msgs[2]["content"] == {"seq": 1}
        # the recall notice is not news
        assert await _unread(S, conv) == 0
    finally:
        await dev.close()


async def test_recall_too_late(stores: Stores) -> None:
    srv = await asyncio.to_thread(
        ServerProcess(env={**stores.env(), "IM_RECALL_WINDOW_SECONDS": "1"}).start
    )
    Own = S = None
    try:
        Own, S = await new_user(srv.url, "own"), await new_user(srv.url, "mem")
        gid = (await Own.create_group("late", [S.user_id]))["group_id"]
        conv = group_conv_id(gid)
        # a plain member's own messages (the owner and admins recall at any age)
        assert await _send(S, conv, "fast") == 1
        assert await _send(S, conv, "slow") == 2
        await _persisted(Own, conv, 2)
        assert (await S.recall(conv, 1)) is not None, "within the window it works"
        await asyncio.sleep(1.5)  # under test: the 1 s recall window runs out
        await _expect(S.recall(conv, 2), 403, "forbidden")

        async def settled() -> list[dict[str, Any]] | None:
            msgs = (await Own.history(conv))["messages"]
            return msgs if len(msgs) == 3 and msgs[0]["recalled"] else None

        msgs = await eventually(settled, timeout=15.0)
        assert msgs[1]["recalled"] is False and msgs[1]["content"] == {"text": "slow"}
    finally:
        for c in (Own, S):
            if c is not None:
                await c.aclose()
        await asyncio.to_thread(srv.terminate)


# -- the seed's question ----------------------------------------------------------------------


async def test_window_above_requested_range_is_empty_not_error(make: Make, stores: Stores) -> None:
    """Conversation min and my min both 100, ask for 1..50: an empty list, not an error."""
    Own, S = await make("own"), await make("mem")
    gid = (await Own.create_group("seed", [S.user_id]))["group_id"]
    conv = group_conv_id(gid)
    conn = await Own.connect()
    try:
        futs = [await conn.send_nowait(conv, f"m{i}") for i in range(1, 100)]
        acks = await asyncio.gather(*futs)
    finally:
        await conn.close()
    assert sorted(a["seq"] for a in acks) == list(range(1, 100)), acks[:3]
    await _persisted(Own, conv, 99)

    cleared = await Own.clear(conv)  # my min = 100
    if isinstance(cleared, dict) and "min_seq" in cleared:
        assert cleared["min_seq"] == 100, cleared
    pg = await asyncpg.connect(stores.pg.url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await pg.execute("UPDATE conversations SET min_seq = 100 WHERE conv_id = $1", conv)
    finally:
        await pg.close()

    for who in (Own, S):  # Own: both mins at 100; S: the conversation's alone
        for order in ("asc", "desc"):
            page = await who.history(conv, begin=1, end=50, order=order)
            assert page["messages"] == [], (who, order, page)
            assert page["min_seq"] == 100, page
            if order == "desc":
                assert page["is_end"] is True, page
        assert (await who.history(conv))["messages"] == []
        st = await _state(who, conv)
        assert st["min_seq"] == 100 and st["unread"] == 0, st

    assert await _send(S, conv, "m100") == 100
    await _persisted(Own, conv, 100)
    for who in (Own, S):
        assert _seqs(await who.history(conv, begin=1, end=50)) == []
        assert _seqs(await who.history(conv, begin=1, end=200)) == [100]
    assert await _unread(Own, conv) == 1


# -- adding members: set-based, skipping members, never stalling the server --------------


async def test_one_add_call_joins_rejoins_and_skips(make: Make) -> None:
    """One call naming a current member, a kicked member and a new user: the member is
    left exactly as it was, the kicked one re-joins after the current end with its
    cursor there, the new one starts after the end with no cursor."""
    owner, stay, back, new = [await make(p) for p in ("own", "stay", "back", "new")]
    gid = (await owner.create_group("mix", [stay.user_id, back.user_id]))["group_id"]
    conv = group_conv_id(gid)
    await _send(owner, conv, "one")
    await stay.read_rest(conv, 1)
    await owner.kick(gid, back.user_id)  # type: ignore[arg-type]
    end = await _send(owner, conv, "two")
    await _persisted(owner, conv, end)
    before = await _state(stay, conv)

    res = await owner.add_members(gid, [stay.user_id, back.user_id, new.user_id])  # type: ignore[list-item]
    assert sorted(res["added"]) == sorted([back.user_id, new.user_id]), res
    notice = end + 1
    await _persisted(owner, conv, notice)
    after = await _state(stay, conv)
    assert (
        (after["min_seq"], after["read_seq"]) == (before["min_seq"], before["read_seq"]) == (1, 1)
    )
    for c in (back, new):
        st = await _state(c, conv)
        assert st["min_seq"] == end + 1 and st["active"] is True, st
    assert (await _state(back, conv))["read_seq"] == end
    assert (await _state(new, conv))["read_seq"] == 0
    # the notice names who joined; a repeat of the same call changes nothing
    page = await owner.history(conv, begin=notice, end=notice)
    content = page["messages"][0]["content"]
    assert sorted(content["user_ids"]) == sorted([back.user_id, new.user_id]), content
    again = await owner.add_members(gid, [stay.user_id, back.user_id, new.user_id])  # type: ignore[list-item]
    assert again["added"] == []
    assert (await owner.history(conv, order="desc", limit=1))["max_seq"] == notice


async def _register_many(url: str, n: int) -> list[int]:
    async with HttpPool(base_url=url, timeout=60, max_connections=16) as h:

        async def one() -> int:
            body = {"username": f"bulk{uuid.uuid4().hex[:12]}", "password": PASSWORD}
            r = await h.post("/v1/users", json=body)
            assert r.status_code == 201, r.text
            return int(r.json()["user_id"])

        return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_member_add_storm_does_not_stall_other_requests(make: Make, url: str) -> None:
    """60 concurrent adds of 1500 users who are all members already write nothing and
    take no lock: another user's read and a write that needs the sync-version lock answer
    within a bound meanwhile, and nobody gets a 503 from an exhausted pool."""
    owner, other = await make("own"), await make("other")
    ids = await _register_many(url, 1500)
    created = await owner.create_group("big", ids)
    gid, conv = created["group_id"], created["conv_id"]
    await _send(owner, conv, "hello")

    async def timed(call: Awaitable[Any]) -> float:
        t0 = time.monotonic()
        await call
        return time.monotonic() - t0

    storm = [asyncio.ensure_future(owner.add_members(gid, ids)) for _ in range(60)]
    # the storm has reached the server once its first call is answered; the calls below
    # must run while the others are still in flight, or they would measure nothing
    await asyncio.wait(storm, return_when=asyncio.FIRST_COMPLETED)
    assert not all(t.done() for t in storm), "the storm was over before the timed calls"
    read_s = await timed(other.conversations())
    write_s = await timed(other.create_group("meanwhile", []))
    results = await asyncio.gather(*storm)
    assert all(r["added"] == [] for r in results), results[:2]
    assert read_s < 2.0 and write_s < 2.0, (read_s, write_s)
    # adding 400 new users at once is one statement, and one notice
    fresh = await _register_many(url, 400)
    t0 = time.monotonic()
    res = await owner.add_members(gid, fresh)
    assert sorted(res["added"]) == sorted(fresh) and time.monotonic() - t0 < 5
    assert len(await owner.members(gid)) == 1 + 1500 + 400


async def test_whoever_blocked_me_cannot_be_put_in_my_group(make: Make) -> None:
    owner, friend, blocker = await make("own"), await make("fr"), await make("blk")
    await blocker.block(owner.user_id)  # type: ignore[arg-type]
    before = len(await owner.conversations())
    await _expect(owner.create_group("nope", [friend.user_id, blocker.user_id]), 403, "blocked")  # type: ignore[list-item]
    assert len(await owner.conversations()) == before  # no group was made
    gid = (await owner.create_group("ok", [friend.user_id]))["group_id"]  # type: ignore[list-item]
    await _expect(owner.add_members(gid, [blocker.user_id]), 403, "blocked")  # type: ignore[list-item]
    assert blocker.user_id not in _roles(await owner.members(gid))
    # the block is one way: the blocker can still put me in a group of theirs
    theirs = await blocker.create_group("theirs", [owner.user_id])  # type: ignore[list-item]
    assert owner.user_id in _roles(await blocker.members(theirs["group_id"]))
    # and once lifted, adding works
    await blocker.unblock(owner.user_id)  # type: ignore[arg-type]
    assert (await owner.add_members(gid, [blocker.user_id]))["added"] == [blocker.user_id]  # type: ignore[list-item]


async def test_member_rows_are_written_before_the_sync_version_is_taken(
    make: Make, stores: Stores
) -> None:
    """Every writer of the server waits for the sync-version row, so a member add takes it
    last: while the add waits for it (held here), its member rows are already written
    (the add's transaction holds its row lock on ``conv_members``), so the row is held
    for a stamp and a commit, not for the bulk of the writes. Once it is free, the add
    completes and the new members' sync sees the group."""
    owner, a, b = await make("vo"), await make("va"), await make("vb")
    g = await owner.create_group("versions", [])
    conv = group_conv_id(g["group_id"])
    since = {c: (await c.sync(since=0))["version"] for c in (a, b)}
    async with pg(stores) as db:
        tx = db.transaction()
        await tx.start()
        await db.execute("SELECT version FROM sync_version WHERE id = 1 FOR UPDATE")
        adding = asyncio.create_task(owner.add_members(g["group_id"], [a.user_id, b.user_id]))  # type: ignore[list-item]
        try:
            # the waiter that already holds its writes on conv_members: the add (statistics
            # views keep one snapshot per transaction: read them on another connection)
            async with pg(stores) as look:

                async def waiting_with_rows() -> bool:
                    return bool(
                        await look.fetchval(
                            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a JOIN pg_locks l "
                            "ON l.pid = a.pid AND l.granted "
                            "AND l.relation = 'conv_members'::regclass "
                            "AND l.mode = 'RowExclusiveLock' "
                            "WHERE a.wait_event_type = 'Lock' "
                            "AND a.query LIKE 'UPDATE sync_version%')"
                        )
                    )

                assert await eventually(waiting_with_rows), "rows written after the version"
            assert not adding.done()
        finally:
            await tx.rollback()
        await adding
    for c in (a, b):
        page = await c.sync(since=since[c])
        assert conv in [s["conv_id"] for s in page["conversations"]], page
        assert page["version"] > since[c]
