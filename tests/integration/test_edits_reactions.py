"""Edits and reactions against the contract (PROTOCOL.md "Mentions, replies, edits,
reactions"): who may edit, the edit window, idempotency, the edited original on every read
path and device; reactions counted per reader, idempotent, limited, exact under
concurrency; window rules; notices never unread."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import orjson
import pytest

from im_server.client import ApiError, Client, group_conv_id
from tests.support import Make, ServerProcess, Stores, eventually, new_user, pg, rds
from tests.support import persisted as _persisted
from tests.support import send_ok as _send


async def _expect(call: Awaitable[Any], status: int, code: str) -> None:
    with pytest.raises(ApiError) as ei:
        await call
    assert (ei.value.status, ei.value.code) == (status, code), ei.value


async def _msg(c: Client, conv: str, seq: int) -> dict[str, Any]:
    msgs = (await c.history(conv, begin=seq, end=seq))["messages"]
    assert len(msgs) == 1, msgs
    return dict(msgs[0])


async def _notices(c: Client, conv: str, ctype: str) -> list[dict[str, Any]]:
    return [m for m in (await c.history(conv, limit=500))["messages"] if m["content_type"] == ctype]


async def _group(make: Make, n: int = 2) -> tuple[list[Client], str]:
    users = [await make(f"m{i}") for i in range(n + 1)]
    g = await users[0].create_group("er", [u.user_id for u in users[1:]])  # type: ignore[misc]
    return users, group_conv_id(g["group_id"])


def _reactions(m: dict[str, Any]) -> dict[str, tuple[int, bool]]:
    return {r["emoji"]: (r["count"], r["mine"]) for r in m["reactions"]}


# -- edits ----------------------------------------------------------------------------------


async def test_edit_reaches_every_read_path_and_device(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    seq = await _send(alice, conv, "one")
    await _persisted(alice, conv, seq)
    dev = await bob.connect()
    other = await alice.connect()  # the editor's other device
    try:
        fresh = await _msg(bob, conv, seq)
        assert fresh["edited_at"] is None and fresh["reactions"] == [], fresh
        res = await alice.edit(conv, seq, "two")
        assert res["type"] == "edited" and res["conv_id"] == conv and res["seq"] == seq, res
        assert res["edit_seq"] == seq + 1 and isinstance(res["edited_at"], int), res
        for d in (dev, other):
            push = (
                await d.next_event("message", predicate=lambda f: f["message"]["seq"] == seq + 1)
            )["message"]
            assert push["content_type"] == "edit" and push["sender_id"] == alice.user_id, push
            assert push["content"] == {"seq": seq, "content": {"text": "two"}}, push
            assert push["server_time"] == res["edited_at"], push
        # history, for both sides, at once (the request updated the original)
        for c in (alice, bob):
            m = await _msg(c, conv, seq)
            assert m["content"] == {"text": "two"} and m["edited_at"] == res["edited_at"], m
            assert m["content_type"] == "text" and m["recalled"] is False, m
        # sync's messages and the conversation state
        page = await bob.sync(0)
        st = next(s for s in page["conversations"] if s["conv_id"] == conv)
        orig = next(m for m in st["messages"] if m["seq"] == seq)
        assert orig["content"] == {"text": "two"} and orig["edited_at"] == res["edited_at"]
        assert st["last_message"]["content_type"] == "edit", st  # as recall notices are
        # the notice is never unread: bob has one unread message, the original
        assert (await bob.unread())["total"] == 1
        assert [s["unread"] for s in await bob.conversations() if s["conv_id"] == conv] == [1]
    finally:
        await dev.close()
        await other.close()


async def test_edit_is_idempotent(pair: tuple[Client, Client, str]) -> None:
    alice, _bob, conv = pair
    seq = await _send(alice, conv, "draft")
    # an edit to the content the message already has: answered, nothing sent
    same = await alice.edit(conv, seq, "draft")
    assert same["edit_seq"] is None and same["edited_at"] is None, same
    first = await alice.edit(conv, seq, "final")
    again = await alice.edit(conv, seq, "final")
    assert again == first
    # a client retrying many times at once: one notice
    seq2 = await _send(alice, conv, "x")
    answers = await asyncio.gather(*(alice.edit(conv, seq2, "y") for _ in range(8)))
    assert len({(a["edit_seq"], a["edited_at"]) for a in answers}) == 1, answers

    async def settled() -> list[dict[str, Any]] | None:
        n = await _notices(alice, conv, "edit")
        return n if len(n) == 2 else None

    notices = await eventually(settled)
    assert [n["content"]["seq"] for n in notices] == [seq, seq2], notices
    # back to an earlier content is a new edit (A -> B -> A)
    back = await alice.edit(conv, seq, "draft")
    assert back["edit_seq"] is not None and back["edit_seq"] > first["edit_seq"], back
    assert (await _msg(alice, conv, seq))["content"] == {"text": "draft"}
    await eventually(lambda: _count_is(alice, conv, "edit", 3))


async def _count_is(c: Client, conv: str, ctype: str, n: int) -> bool:
    return len(await _notices(c, conv, ctype)) == n


async def test_edit_refusals(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    seq = await _send(alice, conv, "mine")
    await _expect(bob.edit(conv, seq, "theirs"), 403, "forbidden")
    await _expect(alice.edit(conv, seq, ""), 400, "bad_request")  # the text rule
    await _expect(alice.edit(conv, seq, {"image": "x"}), 400, "bad_request")
    await _expect(alice.edit(conv, seq, "x" * 20000), 413, "too_large")
    await _expect(alice.edit(conv, 10**12, "far"), 404, "not_found")
    # a message of another type (not a picture or file) takes any object
    ack = await alice.send_rest(conv, {"url": "a.png"}, content_type="sticker")
    res = await alice.edit(conv, ack["seq"], {"url": "b.png"})
    assert (await _msg(bob, conv, ack["seq"]))["content"] == {"url": "b.png"}, res
    # notices cannot be edited, nor reacted to
    await _expect(alice.edit(conv, res["edit_seq"], "no"), 404, "not_found")
    await _expect(bob.react(conv, res["edit_seq"], "👍"), 404, "not_found")
    # a recalled message
    await alice.recall(conv, seq)
    await _expect(alice.edit(conv, seq, "late"), 409, "conflict")
    await _expect(bob.react(conv, seq, "👍"), 409, "conflict")
    assert (await _msg(alice, conv, seq))["content"] is None
    assert (await _msg(bob, conv, seq))["reactions"] == []
    # none of the refusals left a notice: one edit, one recall
    await eventually(lambda: _count_is(alice, conv, "recall", 1))
    assert len(await _notices(alice, conv, "edit")) == 1


async def test_the_persister_applies_edit_notices(
    stores: Stores, server: ServerProcess, pair: tuple[Client, Client, str]
) -> None:
    """Durable state drives the edit: with the request's own update lost, the stored
    notices set the content again, in seq order whatever order they arrive in."""
    alice, bob, conv = pair
    seq = await _send(alice, conv, "v1")
    await alice.edit(conv, seq, "v2")
    last = await alice.edit(conv, seq, "v3")
    await eventually(lambda: _count_is(alice, conv, "edit", 2))
    notices = await _notices(alice, conv, "edit")
    async with pg(stores) as c:
        await c.execute(
            'UPDATE messages SET content = \'{"text": "v1"}\', edited_at = NULL, '
            "edit_seq = NULL WHERE conv_id = $1 AND seq = $2",
            conv,
            seq,
        )
    assert (await _msg(bob, conv, seq))["content"] == {"text": "v1"}
    async with rds(stores) as r:
        for n in reversed(notices):  # the newest first: the older must not win after it
            body = orjson.dumps(n["content"]).decode()
            parts = [conv, str(alice.user_id), n["client_msg_id"], "edit", body]
            parts += [str(n["server_time"]), "0", "0"]
            await r.xadd("im:stream:{p0}", {"q": n["seq"], "d": "\0".join(parts)})

    async def applied() -> dict[str, Any] | None:
        m = await _msg(bob, conv, seq)
        return m if m["content"] == {"text": "v3"} else None

    m = await eventually(applied)
    assert m["edited_at"] == last["edited_at"], m

    async def drained() -> bool:  # both replays stored (acked and deleted after the commit)
        async with rds(stores) as r:
            return int(await r.xlen("im:stream:{p0}")) == 0

    await eventually(drained)
    assert (await _msg(bob, conv, seq))["content"] == {"text": "v3"}


async def test_edit_needs_the_rights_of_a_send(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    seq = await _send(bob, conv, "before the block")
    await alice.block(bob.user_id)  # type: ignore[arg-type]
    await _expect(bob.edit(conv, seq, "after the block"), 403, "blocked")
    assert (await _msg(alice, conv, seq))["content"] == {"text": "before the block"}
    assert await _notices(alice, conv, "edit") == []


async def test_edit_over_the_websocket(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    seq = await _send(alice, conv, "ws")
    conn = await alice.connect()
    try:
        ans = await conn.edit(conv, seq, "ws edited")
        assert ans["type"] == "edited" and ans["seq"] == seq and ans["edit_seq"] == seq + 1, ans
        err = await conn.edit(conv, seq, "")
        assert err["type"] == "error" and err["code"] == "bad_request", err
        err = await conn.edit(conv, seq + 1, "notice")
        assert err["type"] == "error" and err["code"] == "not_found", err
    finally:
        await conn.close()
    bconn = await bob.connect()
    try:
        err = await bconn.edit(conv, seq, "not mine")
        assert err["type"] == "error" and err["code"] == "forbidden", err
    finally:
        await bconn.close()
    assert (await _msg(bob, conv, seq))["content"] == {"text": "ws edited"}


async def test_edit_window(stores: Stores) -> None:
    srv = await asyncio.to_thread(
        ServerProcess(env={**stores.env(), "IM_EDIT_WINDOW_SECONDS": "1"}).start
    )
    a = b = None
    try:
        a, b = await new_user(srv.url, "ea"), await new_user(srv.url, "eb")
        g = await a.create_group("window", [b.user_id])  # type: ignore[list-item]
        conv = group_conv_id(g["group_id"])
        s1 = await _send(a, conv, "fast")
        s2 = await _send(a, conv, "slow")
        assert (await a.edit(conv, s1, "fast!"))["edit_seq"] is not None
        await asyncio.sleep(1.5)  # under test: the 1 s edit window runs out
        await _expect(a.edit(conv, s2, "slow!"), 403, "forbidden")
        assert (await _msg(b, conv, s2))["content"] == {"text": "slow"}
        # reactions have no window
        await b.react(conv, s2, "⏰")
    finally:
        for c in (a, b):
            if c is not None:
                await c.aclose()
        await asyncio.to_thread(srv.terminate)


async def test_edit_window_rules(make: Make) -> None:
    (own, b, c), conv = await _group(make)
    s1 = await _send(b, conv, "b's")
    await _persisted(own, conv, s1)
    late = await make("late")
    await own.add_members(int(conv[2:]), [late.user_id])  # type: ignore[list-item]
    # a member who cannot see the message: not found, for edits and reactions
    await _expect(late.react(conv, s1, "👍"), 404, "not_found")
    await _expect(late.unreact(conv, s1, "👍"), 404, "not_found")
    await _expect(late.edit(conv, s1, "x"), 404, "not_found")
    assert all(m["seq"] != s1 for m in (await late.history(conv))["messages"])
    # a kicked member: no edits, no reactions, even inside its window
    await c.react(conv, s1, "👀")
    await own.kick(int(conv[2:]), b.user_id)
    await own.kick(int(conv[2:]), c.user_id)
    await _expect(b.edit(conv, s1, "after kick"), 403, "not_member")
    await _expect(c.react(conv, s1, "👍"), 403, "not_member")
    await _expect(c.unreact(conv, s1, "👀"), 403, "not_member")
    assert _reactions(await _msg(own, conv, s1)) == {"👀": (1, False)}
    assert _reactions(await _msg(c, conv, s1)) == {"👀": (1, True)}  # still in its window


# -- reactions ------------------------------------------------------------------------------


async def test_reactions_counted_per_reader(make: Make) -> None:
    (own, b, c), conv = await _group(make)
    seq = await _send(own, conv, "react to me")
    dev = await own.connect()
    try:
        await b.react(conv, seq, "👍")
        await c.react(conv, seq, "👍")
        await c.react(conv, seq, "❤️")
        push = await dev.next_event(
            "message", predicate=lambda f: f["message"]["content_type"] == "reaction"
        )
        assert push["message"]["content"] == {
            "seq": seq,
            "emoji": "👍",
            "user_id": b.user_id,
            "op": "add",
        }, push
        assert push["message"]["sender_id"] == b.user_id
        assert _reactions(await _msg(own, conv, seq)) == {"👍": (2, False), "❤️": (1, False)}
        assert _reactions(await _msg(b, conv, seq)) == {"👍": (2, True), "❤️": (1, False)}
        assert _reactions(await _msg(c, conv, seq)) == {"👍": (2, True), "❤️": (1, True)}
        # ordered by count, then emoji
        assert [r["emoji"] for r in (await _msg(b, conv, seq))["reactions"]] == ["👍", "❤️"]
        # idempotent: no change, no notice
        await b.react(conv, seq, "👍")
        await b.unreact(conv, seq, "🎉")
        await c.unreact(conv, seq, "❤️")
        await c.unreact(conv, seq, "❤️")
        assert _reactions(await _msg(c, conv, seq)) == {"👍": (2, True)}

        async def four() -> list[dict[str, Any]] | None:
            n = await _notices(own, conv, "reaction")
            return n if len(n) == 4 else None

        notices = await eventually(four)
        assert [n["content"]["op"] for n in notices] == ["add", "add", "add", "remove"]
        # reaction notices are never unread, for anyone
        assert (await own.unread())["total"] == 0
        # sync carries them too, for the reader
        st = next(s for s in (await c.sync(0))["conversations"] if s["conv_id"] == conv)
        orig = next(m for m in st["messages"] if m["seq"] == seq)
        assert _reactions(orig) == {"👍": (2, True)}
    finally:
        await dev.close()


async def test_reaction_limits(make: Make) -> None:
    (own, b, c), conv = await _group(make)
    seq = await _send(own, conv, "limits")
    mine = [chr(0x1F600 + i) for i in range(10)]
    theirs = [chr(0x1F680 + i) for i in range(10)]
    await asyncio.gather(*(b.react(conv, seq, e) for e in mine))
    await _expect(b.react(conv, seq, "🧀"), 409, "conflict")  # 11th of one user
    await b.react(conv, seq, mine[0])  # one I have: fine, idempotent
    await asyncio.gather(*(c.react(conv, seq, e) for e in theirs))
    await _expect(own.react(conv, seq, "🧀"), 409, "conflict")  # a 21st emoji
    await own.react(conv, seq, mine[3])  # an emoji already there: fine
    m = await _msg(own, conv, seq)
    assert len(m["reactions"]) == 20 and _reactions(m)[mine[3]] == (2, True)
    await b.unreact(conv, seq, mine[0])
    await own.react(conv, seq, "🧀")  # room again


async def test_reactions_exact_under_concurrency(make: Make, url: str) -> None:
    users = await asyncio.gather(*(new_user(url, "rc") for _ in range(100)))
    own = await make("rown")
    try:
        g = await own.create_group("crowd", [u.user_id for u in users])  # type: ignore[misc]
        conv = group_conv_id(g["group_id"])
        seq = await _send(own, conv, "pile on")
        await _persisted(own, conv, seq)
        await asyncio.gather(*(u.react(conv, seq, "🔥") for u in users))
        assert _reactions(await _msg(own, conv, seq)) == {"🔥": (100, False)}
        # half take it back while the other half add it again (no-ops), all at once
        ops = [u.unreact(conv, seq, "🔥") for u in users[:50]]
        ops += [u.react(conv, seq, "🔥") for u in users[50:]]
        await asyncio.gather(*ops)
        assert _reactions(await _msg(users[0], conv, seq)) == {"🔥": (50, False)}
        assert _reactions(await _msg(users[99], conv, seq)) == {"🔥": (50, True)}
        # the same user, 100 times at once: one reaction, one notice
        await asyncio.gather(*(own.react(conv, seq, "💯") for _ in range(100)))
        assert _reactions(await _msg(own, conv, seq))["💯"] == (1, True)
        await asyncio.gather(*(own.unreact(conv, seq, "💯") for _ in range(100)))
        assert "💯" not in _reactions(await _msg(own, conv, seq))
        # and everyone else's removal, at once, empties it
        await asyncio.gather(*(u.unreact(conv, seq, "🔥") for u in users[50:]))
        assert (await _msg(own, conv, seq))["reactions"] == []

        async def notices() -> bool:
            return await _count_is(own, conv, "reaction", 100 + 50 + 2 + 50)

        await eventually(notices, timeout=20.0)
    finally:
        for u in users:
            await u.aclose()


async def test_reaction_emoji_in_the_path(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    seq = await _send(alice, conv, "emoji")
    good = ("👍🏽", "👨‍👩‍👧", "❤️", "🇫🇷", "#️⃣", "🏳️‍🌈")  # keycap "#": a "#" in the path
    for e in good:
        await bob.react(conv, seq, e)
    got = _reactions(await _msg(alice, conv, seq))
    assert set(got) == set(good), got
    # not one fully-qualified emoji: free text, shortcodes, two emojis, the bare heart
    bad_ones = (" ", "a b", "x" * 33, "\u2028", "\t", "\x00", "\x7f", "+1", "a/b", "%")
    bad_ones += ("?", "#", ":tada:", "👍👍", "❤", "🏽")
    for bad in bad_ones:
        await _expect(bob.react(conv, seq, bad), 400, "bad_request")
    assert set(_reactions(await _msg(alice, conv, seq))) == set(good)
