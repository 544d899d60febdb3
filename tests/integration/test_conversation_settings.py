"""Conversation settings (PROTOCOL.md, "Conversation settings: mute and pin"): ``muted``
and ``pinned`` are mine alone, in every state, synced to my other devices, pinned first
in the list; ``badge`` in GET /v1/unread from the one unread statement."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from typing import Any

import pytest
from sqlalchemy import event

from im_server.client import ApiError, Client
from im_server.config import Settings
from im_server.storage import conv_states
from im_server.storage.db import create_engine
from tests import rawhttp
from tests.support import PASSWORD, Make, ServerProcess, Stores, befriend, pg_dsn
from tests.support import persisted as _persisted


async def _group(make: Make, n: int = 2) -> tuple[Client, list[Client], int, str]:
    """owner, members, group id, conv id."""
    owner = await make("own")
    ms = [await make(f"m{i}") for i in range(n)]
    g = await owner.create_group("settings", [m.user_id for m in ms])
    return owner, ms, int(g["group_id"]), str(g["conv_id"])


async def _expect(call: Awaitable[Any], status: int, code: str) -> None:
    with pytest.raises(ApiError) as ei:
        await call
    assert (ei.value.status, ei.value.code) == (status, code), ei.value


async def _states(c: Client) -> dict[str, dict[str, Any]]:
    return {s["conv_id"]: s for s in await c.conversations()}


async def _synced(c: Client, since: int = 0) -> dict[str, dict[str, Any]]:
    return {s["conv_id"]: s for s in (await c.sync(since))["conversations"]}


def _flags(st: dict[str, Any]) -> tuple[bool, bool]:
    return bool(st["muted"]), bool(st["pinned"])


async def _badge(c: Client) -> int:
    """The badge, checked against the rule over the states' own counts."""
    got = await c.unread()
    want = sum(
        s["mention_unread"] if s["muted"] else s["unread"] for s in (await _states(c)).values()
    )
    assert got["badge"] == want, (got, await c.conversations())
    return int(got["badge"])


# -- the settings themselves ---------------------------------------------------------------


async def test_settings_default_off_in_every_state(make: Make) -> None:
    a, b = await make("a"), await make("b")
    single = await befriend(a, b)
    _owner, _ms, _gid, group = await _group(make)
    for conv, who in ((single, a), (single, b)):
        assert _flags((await _states(who))[conv]) == (False, False)
        assert _flags((await _synced(who))[conv]) == (False, False)
    owner = _owner
    assert _flags((await _states(owner))[group]) == (False, False)
    assert _flags((await _synced(owner))[group]) == (False, False)
    assert (await a.unread()) == {"total": 0, "badge": 0, "conversations": []}


async def test_partial_bodies_keep_the_other_value_and_each_side_is_its_own(make: Make) -> None:
    a, b = await make("a"), await make("b")
    conv = await befriend(a, b)
    assert await a.conversation_settings(conv, muted=True) == {
        "conv_id": conv,
        "muted": True,
        "pinned": False,
    }
    assert await a.conversation_settings(conv, pinned=True) == {
        "conv_id": conv,
        "muted": True,
        "pinned": True,
    }
    assert await a.conversation_settings(conv, muted=False) == {
        "conv_id": conv,
        "muted": False,
        "pinned": True,
    }
    assert _flags((await _states(a))[conv]) == (False, True)
    # the peer's side of the same single chat is untouched
    assert _flags((await _states(b))[conv]) == (False, False)
    # an empty body answers the current values
    assert await a.conversation_settings(conv) == {"conv_id": conv, "muted": False, "pinned": True}


async def test_a_change_moves_the_version_and_reaches_my_other_device(make: Make, url: str) -> None:
    a, b = await make("a"), await make("b")
    conv = await befriend(a, b)
    phone = await Client.login(url, a.username or "", PASSWORD, device_id="phone")
    try:
        base = await phone.sync(0)
        v0 = int(base["version"])
        before = (await _states(a))[conv]["version"]
        # a long poll on the phone is woken by the change on the other device
        poll = asyncio.create_task(phone.sync(v0, wait=20))
        await asyncio.sleep(0)
        await a.conversation_settings(conv, muted=True, pinned=True)
        page = await asyncio.wait_for(poll, 20)
        st = {s["conv_id"]: s for s in page["conversations"]}[conv]
        assert _flags(st) == (True, True)
        assert st["version"] > before
        assert int(page["version"]) >= st["version"]
        # a request that changes nothing moves no version, and a sync after it is empty
        v1 = int(page["version"])
        again = await a.conversation_settings(conv, muted=True)
        assert again == {"conv_id": conv, "muted": True, "pinned": True}
        assert (await _states(a))[conv]["version"] == st["version"]
        assert (await phone.sync(v1))["conversations"] == []
        # the peer's sync does not see my settings change
        assert conv not in await _synced(b, v0)
    finally:
        await phone.aclose()


async def test_pinned_conversations_are_listed_first(make: Make) -> None:
    a = await make("a")
    peers = [await make(f"p{i}") for i in range(3)]
    convs = [await befriend(a, p) for p in peers]
    last = None
    for conv, p in zip(convs, peers, strict=True):  # convs[2] has the newest message
        last = await p.send_rest(conv, "hi")
        await _persisted(a, conv, int(last["seq"]))
    order = [s["conv_id"] for s in await a.conversations()]
    assert order[:3] == [convs[2], convs[1], convs[0]], order
    await a.conversation_settings(convs[0], pinned=True)
    order = [s["conv_id"] for s in await a.conversations()]
    assert order[:3] == [convs[0], convs[2], convs[1]], order
    await a.conversation_settings(convs[1], pinned=True)
    order = [s["conv_id"] for s in await a.conversations()]
    assert order[:3] == [convs[1], convs[0], convs[2]], "pinned by recency, then the rest"
    await a.conversation_settings(convs[1], pinned=False)
    await a.conversation_settings(convs[0], pinned=False)
    order = [s["conv_id"] for s in await a.conversations()]
    assert order[:3] == [convs[2], convs[1], convs[0]], order


async def test_a_member_who_left_may_still_set_a_conversation_still_in_the_list(
    make: Make,
) -> None:
    owner, (m0, _m1), gid, conv = await _group(make)
    await owner.kick(gid, m0.user_id)
    st = (await _states(m0))[conv]
    assert st["active"] is False
    assert (await m0.conversation_settings(conv, pinned=True))["pinned"] is True
    assert _flags((await _states(m0))[conv]) == (False, True)


async def test_concurrent_puts_from_two_devices_end_consistent(make: Make, url: str) -> None:
    a, b = await make("a"), await make("b")
    conv = await befriend(a, b)
    phone = await Client.login(url, a.username or "", PASSWORD, device_id="phone")
    try:
        # different fields at once: neither write undoes the other
        await asyncio.gather(
            a.conversation_settings(conv, muted=True),
            phone.conversation_settings(conv, pinned=True),
        )
        assert _flags((await _states(a))[conv]) == (True, True)
        # the same fields at once, many times: the stored value is the last write's, and
        # every device's sync agrees with the list
        rng = random.Random(14)
        calls = [
            (dev, rng.choice([True, False]), rng.choice([True, False]))
            for dev in (a, phone)
            for _ in range(15)
        ]
        answers = await asyncio.gather(
            *(dev.conversation_settings(conv, muted=m, pinned=p) for dev, m, p in calls)
        )
        assert {(x["muted"], x["pinned"]) for x in answers} <= {(m, p) for _, m, p in calls}
        final = _flags((await _states(a))[conv])
        assert final in {(m, p) for _, m, p in calls}
        assert _flags((await _synced(a))[conv]) == final
        assert _flags((await _synced(phone))[conv]) == final
        assert await phone.conversation_settings(conv) == {
            "conv_id": conv,
            "muted": final[0],
            "pinned": final[1],
        }
    finally:
        await phone.aclose()


# -- bad input changes nothing --------------------------------------------------------------


async def test_bad_input_is_refused_and_changes_nothing(make: Make, server: ServerProcess) -> None:
    a, b, z = await make("a"), await make("b"), await make("z")
    conv = await befriend(a, b)
    _owner, _ms, gid, group = await _group(make)
    await a.conversation_settings(conv, pinned=True)
    before = (await _states(a))[conv]
    path = f"/v1/conversations/{conv}/settings"
    for body in (
        {"muted": "true"},
        {"muted": 1},
        {"pinned": 0},
        {"muted": None},
        {"muted": True, "pinned": "no"},
        {"muted": [True]},
        {"pinned": {"x": 1}},
    ):
        await _expect(a.request("PUT", path, json=body), 400, "bad_request")
    for body in ([True], "muted", 1):
        with pytest.raises(ApiError) as ei:
            await a.request("PUT", path, json=body)
        assert ei.value.status in (400, 422), ei.value
    # a huge body is refused from its Content-Length, unread
    sock = rawhttp.connect(server.port)
    sock.sendall(
        rawhttp.request(
            "PUT",
            path,
            {
                "Content-Type": "application/json",
                "Content-Length": str(48 * 1024 * 1024),
                "Authorization": f"Bearer {a.token}",
            },
        )
    )
    answer = rawhttp.read_to_close(sock, 5)
    sock.close()
    assert answer.status == 413, answer.raw[:300]
    # no body at all is a malformed request (an empty object is the way to ask)
    with pytest.raises(ApiError) as ei:
        await a.request("PUT", path)
    assert ei.value.status == 422, ei.value
    # unknown fields are ignored, like every REST body
    assert await a.request("PUT", path, json={"colour": "red"}) == {
        "conv_id": conv,
        "muted": False,
        "pinned": True,
    }
    # not mine: the answers of the other per-conversation endpoints
    await _expect(z.conversation_settings(conv, muted=True), 403, "not_member")
    await _expect(z.conversation_settings(group, muted=True), 403, "not_member")
    await _expect(z.conversation_settings(f"g:{2**62 + 77}", muted=True), 404, "not_found")
    single_z = f"s:{min(a.user_id or 0, z.user_id or 0)}:{max(a.user_id or 0, z.user_id or 0)}"
    await _expect(z.conversation_settings(single_z, muted=True), 404, "not_found")
    await _expect(a.request("PUT", "/v1/conversations/nope/settings", json={}), 400, "bad_request")
    after = (await _states(a))[conv]
    assert after == before, (before, after)
    assert _flags((await _states(b))[conv]) == (False, False)
    assert gid


# -- the badge ------------------------------------------------------------------------------


async def test_badge_follows_mute_unmute_and_mentions(make: Make) -> None:
    owner, (m0, m1), gid, group = await _group(make)
    await owner.request(
        "PUT", f"/v1/groups/{gid}/members/{m1.user_id}/role", json={"role": "admin"}
    )
    peer = await make("peer")
    single = await befriend(m0, peer)
    await owner.send_rest(group, "plain 1")
    await owner.send_rest(group, "at m0", mentions=[m0.user_id])
    s = await m1.send_rest(group, "at all", mention_all=True)
    await _persisted(m0, group, int(s["seq"]))
    p = await peer.send_rest(single, "hello")
    await peer.send_rest(single, "again")
    await _persisted(m0, single, int(p["seq"]) + 1)
    assert await _badge(m0) == 5
    await m0.conversation_settings(group, muted=True)
    assert await _badge(m0) == 2 + 2, "a muted group adds only its two mentions"
    await m0.conversation_settings(single, muted=True)
    assert await _badge(m0) == 2, "a muted single chat without mentions adds nothing"
    unread = await m0.unread()
    assert unread["total"] == 5, "total stays the plain sum"
    items = {x["conv_id"]: x for x in unread["conversations"]}
    assert (items[group]["unread"], items[group]["mention_unread"]) == (3, 2)
    # a new mention breaks through the mute; a plain message does not
    await owner.send_rest(group, "plain 2")
    s = await owner.send_rest(group, "at m0 again", mentions=[m0.user_id])
    await _persisted(m0, group, int(s["seq"]))
    assert await _badge(m0) == 3
    await m0.conversation_settings(group, muted=False)
    assert await _badge(m0) == 5
    # reading brings it down
    await m0.read_rest(group, int(s["seq"]))
    assert await _badge(m0) == 0
    await m0.conversation_settings(single, muted=False)
    assert await _badge(m0) == 2
    # pinning has nothing to do with the badge
    await m0.conversation_settings(single, pinned=True)
    assert await _badge(m0) == 2


async def test_badge_respects_windows_and_never_counts_notices(make: Make) -> None:
    owner, (m0, m1), gid, group = await _group(make)
    s1 = await owner.send_rest(group, "one", mentions=[m0.user_id])
    await owner.send_rest(group, "two")
    await _persisted(m0, group, int(s1["seq"]) + 1)
    assert await _badge(m0) == 2
    # notices (recall, edit, reaction) are never counted, muted or not
    await owner.recall(group, int(s1["seq"]) + 1)
    await owner.edit(group, int(s1["seq"]), "one, edited")
    await owner.react(group, int(s1["seq"]), "👍")
    end = int((await owner.send_rest(group, "three"))["seq"])
    await _persisted(m0, group, end)
    assert await _badge(m0) == 3, await m0.conversations()
    await m0.conversation_settings(group, muted=True)
    assert await _badge(m0) == 1
    # kicked: the window ends at the kick, nothing after it counts
    await m0.conversation_settings(group, muted=False)
    await owner.kick(gid, m0.user_id)
    s = await owner.send_rest(group, "after the kick", mention_all=True)
    await _persisted(owner, group, int(s["seq"]))
    assert await _badge(m0) == 3
    await m0.conversation_settings(group, muted=True)
    assert await _badge(m0) == 1
    # cleared history is not counted
    await m1.conversation_settings(group, muted=True)
    assert await _badge(m1) == 1  # the mention_all after the kick
    await m1.clear(group)
    assert await _badge(m1) == 0
    s = await owner.send_rest(group, "after the clear", mention_all=True)
    await owner.send_rest(group, "plain after the clear")
    await _persisted(m1, group, int(s["seq"]) + 1)
    assert await _badge(m1) == 1
    await m1.conversation_settings(group, muted=False)
    assert await _badge(m1) == 2


async def test_counts_and_badge_come_from_one_statement(make: Make, stores: Stores) -> None:
    owner, (m0, _m1), _gid, group = await _group(make)
    peer = await make("peer")
    single = await befriend(m0, peer)
    for kw in ({"mentions": [m0.user_id]}, {"mention_all": True}, {}):
        s = int((await owner.send_rest(group, "x", **kw))["seq"])
    await _persisted(m0, group, s)
    s = int((await peer.send_rest(single, "y"))["seq"])
    await _persisted(m0, single, s)
    await m0.conversation_settings(group, muted=True)
    engine = create_engine(Settings(database_url=pg_dsn(stores), redis_url="redis://x"))
    sent: list[str] = []

    def count(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")  # the connection's own set-up
            sent.clear()
            got = await conv_states.unread(conn, m0.user_id)
            assert len(sent) == 1, sent
            assert sorted(got.rows) == sorted([(group, 3, 2), (single, 1, 0)]), got
            assert got.badge == 2 + 1
            sent.clear()
            empty = await conv_states.unread(conn, owner.user_id or 0)
            assert len(sent) == 1 and empty.rows == [] and empty.badge == 0
            sent.clear()
            states = await conv_states.states(conn, m0.user_id or 0, conv_ids=[group])
            assert len(sent) == 1, sent
            assert _flags(states[0]) == (True, False)
    finally:
        await engine.dispose()
