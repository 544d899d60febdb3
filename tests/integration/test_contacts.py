"""Contacts against the contract (PROTOCOL.md "Accounts and contacts", seed 000):
friend requests, one-sided removal (the remover's clear point survives adding back),
one-way blocks, and the one-sided clear and hide of a single chat."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

from im_server.client import ApiError, Client, single_conv_id
from im_server.client.transport import Response
from tests.support import Stores, befriend, eventually, new_user, pg
from tests.support import persisted as _persisted
from tests.support import send_ok as _send

UNKNOWN_USER = 2**62 + 12345


@pytest.fixture
async def carol(url: str) -> AsyncIterator[Client]:
    c = await new_user(url, "carol")
    yield c
    await c.aclose()


async def _raw(c: Client, method: str, path: str, json: Any = None) -> Response:
    """A REST call whose status code the test wants to see (201 vs 200)."""
    return await c.http.request(
        method, c.base_url + path, json=json, headers={"Authorization": f"Bearer {c.token}"}
    )


async def _api_error(call: Awaitable[Any]) -> ApiError:
    with pytest.raises(ApiError) as ei:
        await call
    return ei.value


def _seqs(page: dict[str, Any]) -> list[int]:
    return [m["seq"] for m in page["messages"]]


async def _state(c: Client, conv: str) -> dict[str, Any] | None:
    return {s["conv_id"]: s for s in await c.conversations()}.get(conv)


async def _unread(c: Client, conv: str) -> int:
    """The unread count, checked to agree between GET /v1/unread and the state."""
    listed = {x["conv_id"]: x["unread"] for x in (await c.unread())["conversations"]}
    st = await _state(c, conv)
    if st is not None:
        assert listed.get(conv, 0) == st["unread"], (listed, st)
    return int(listed.get(conv, 0))


async def _refused(sender: Client, conv: str, code: str) -> None:
    """Both the WebSocket ack and the REST send refuse with ``code``."""
    conn = await sender.connect()
    try:
        ack = await conn.send(conv, "should be refused")
    finally:
        await conn.close()
    assert ack["ok"] is False and ack["code"] == code, ack
    err = await _api_error(sender.send_rest(conv, "should be refused too"))
    assert (err.status, err.code) == (403, code), err


# -- requests ----------------------------------------------------------------------------


async def test_request_list_accept(alice: Client, bob: Client, carol: Client) -> None:
    a, b = alice.user_id, bob.user_id
    assert a is not None and b is not None
    r = await _raw(alice, "POST", "/v1/friends/requests", {"to_user_id": b, "note": "hi, it's A"})
    assert r.status_code == 201, r.text
    rid = r.json()["request_id"]
    assert isinstance(rid, int) and rid > 0

    mine = await alice.friend_requests()
    theirs = await bob.friend_requests()
    assert mine["incoming"] == [] and theirs["outgoing"] == []
    (out,) = mine["outgoing"]
    (inc,) = theirs["incoming"]
    assert out == inc
    assert out["request_id"] == rid
    assert out["from_user_id"] == a and out["to_user_id"] == b
    assert out["note"] == "hi, it's A"
    assert isinstance(out["created_at"], int) and out["created_at"] > 1_600_000_000_000

    # only the addressee can accept: a third user, and the requester herself, get 404
    for wrong in (carol, alice):
        err = await _api_error(wrong.accept_friend(rid))
        assert (err.status, err.code) == (404, "not_found"), err
    err = await _api_error(bob.accept_friend(2**62))
    assert (err.status, err.code) == (404, "not_found"), err
    assert await alice.friends() == [], "nothing happened before the real accept"

    r = await _raw(bob, "POST", f"/v1/friends/requests/{rid}/accept")
    assert r.status_code == 200, r.text
    conv = r.json()["conv_id"]
    assert conv == single_conv_id(a, b)

    for c in (alice, bob):
        reqs = await c.friend_requests()
        assert reqs == {"incoming": [], "outgoing": []}, "accepted requests are not pending"
    assert await alice.friends() == [{"user_id": b, "username": bob.username, "conv_id": conv}]
    assert await bob.friends() == [{"user_id": a, "username": alice.username, "conv_id": conv}]

    # already friends: either direction is a conflict
    for c, other in ((alice, b), (bob, a)):
        err = await _api_error(c.request_friend(other))
        assert (err.status, err.code) == (409, "conflict"), err

    # and the chat works both ways
    assert await _send(alice, conv, "hello") == 1
    assert await _send(bob, conv, "hi") == 2


async def test_mutual_requests_auto_accept(alice: Client, bob: Client) -> None:
    a, b = alice.user_id, bob.user_id
    assert a is not None and b is not None
    await alice.request_friend(b, "from a")
    r = await _raw(bob, "POST", "/v1/friends/requests", {"to_user_id": a, "note": "from b"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert isinstance(body["request_id"], int)
    assert body["conv_id"] == single_conv_id(a, b), body
    for c in (alice, bob):
        assert await c.friend_requests() == {"incoming": [], "outgoing": []}
    assert [f["user_id"] for f in await alice.friends()] == [b]
    assert [f["user_id"] for f in await bob.friends()] == [a]
    assert await _send(bob, body["conv_id"], "we are friends") == 1


async def test_request_validation(alice: Client) -> None:
    assert alice.user_id is not None
    err = await _api_error(alice.request_friend(alice.user_id))
    assert (err.status, err.code) == (400, "bad_request"), err
    err = await _api_error(alice.request_friend(UNKNOWN_USER))
    assert (err.status, err.code) == (404, "not_found"), err
    for bad in ("abc", -1, 0, None, 1.5):
        err = await _api_error(
            alice.request("POST", "/v1/friends/requests", json={"to_user_id": bad})
        )
        assert err.status in (400, 422), (bad, err)
    assert await alice.friend_requests() == {"incoming": [], "outgoing": []}


# -- removing a friend (one-sided) -----------------------------------------------------------


async def test_remove_then_add_back(pair: tuple[Client, Client, str], carol: Client) -> None:
    alice, bob, conv = pair
    a, b = alice.user_id, bob.user_id
    assert a is not None and b is not None
    for i in range(4):
        await _send(alice if i % 2 == 0 else bob, conv, f"m{i + 1}")
    await _persisted(alice, conv, 4)

    await alice.remove_friend(b)

    # the remover's list hides the peer; the peer still lists the remover
    assert [f["user_id"] for f in await alice.friends()] == []
    assert [f["user_id"] for f in await bob.friends()] == [a]
    # the remover's side is cleared and hidden; the peer keeps everything
    mine = await alice.history(conv)
    assert mine["messages"] == [] and mine["min_seq"] == 5, mine
    assert await _state(alice, conv) is None, "removed: gone from the remover's list"
    assert _seqs(await bob.history(conv)) == [1, 2, 3, 4]
    theirs = await _state(bob, conv)
    assert theirs is not None and theirs["min_seq"] == 1 and theirs["max_seq"] == 4, theirs

    # sends are refused both ways while removed
    await _refused(alice, conv, "not_friends")
    await _refused(bob, conv, "not_friends")
    assert _seqs(await bob.history(conv)) == [1, 2, 3, 4], "nothing refused was stored"

    # removing someone who was never a friend is 404
    assert carol.user_id is not None
    err = await _api_error(alice.remove_friend(carol.user_id))
    assert (err.status, err.code) == (404, "not_found"), err

    # adding back: a new request, accepted; "removed" is gone, the clear point stays
    rid = await alice.request_friend(b, "again?")
    assert await bob.accept_friend(rid) == conv
    assert [f["user_id"] for f in await alice.friends()] == [b]
    assert [f["user_id"] for f in await bob.friends()] == [a]
    mine = await alice.history(conv, begin=1, end=4)
    assert mine["messages"] == [] and mine["min_seq"] == 5, "the old history does not come back"
    st = await _state(alice, conv)
    assert st is not None, "added back: listed again"
    assert st["min_seq"] == 5 and st["max_seq"] == 4 and st["last_message"] is None, st
    assert st["unread"] == 0, st

    seq = await _send(bob, conv, "welcome back")
    assert seq == 5
    await _persisted(alice, conv, 5)
    assert _seqs(await alice.history(conv)) == [5]
    assert _seqs(await bob.history(conv)) == [1, 2, 3, 4, 5]
    assert await _unread(alice, conv) == 1
    assert await _send(alice, conv, "thanks") == 6


# -- blocks (one way) -------------------------------------------------------------------------


async def test_block_is_one_way(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    a, b = alice.user_id, bob.user_id
    assert a is not None and b is not None
    r = await _raw(alice, "PUT", f"/v1/blocks/{b}")
    assert r.status_code == 204, r.text
    assert await alice.blocks() == [b]
    assert await bob.blocks() == []

    await _refused(bob, conv, "blocked")
    # the blocker can still write to the blocked user, on both paths
    ca = await alice.connect()
    try:
        ack = await ca.send(conv, "I can still talk")
        assert ack["ok"] is True and ack["seq"] == 1, ack
    finally:
        await ca.close()
    assert await _send(alice, conv, "and over REST") == 2
    await _persisted(bob, conv, 2)
    page = await bob.history(conv)
    assert _seqs(page) == [1, 2] and {m["sender_id"] for m in page["messages"]} == {a}
    # a block is not a removal: both still list each other as friends
    assert [f["user_id"] for f in await alice.friends()] == [b]
    assert [f["user_id"] for f in await bob.friends()] == [a]

    r = await _raw(alice, "DELETE", f"/v1/blocks/{b}")
    assert r.status_code == 204, r.text
    assert await alice.blocks() == []
    assert await _send(bob, conv, "unblocked") == 3


async def test_block_validation(alice: Client) -> None:
    err = await _api_error(alice.block(UNKNOWN_USER))
    assert (err.status, err.code) == (404, "not_found"), err
    assert alice.user_id is not None
    err = await _api_error(alice.block(alice.user_id))
    assert (err.status, err.code) == (400, "bad_request"), err
    assert await alice.blocks() == []


async def test_whoever_blocked_me_gets_no_friend_request_from_me(
    alice: Client, bob: Client, carol: Client
) -> None:
    a, b, c = alice.user_id, bob.user_id, carol.user_id
    assert a is not None and b is not None and c is not None
    await bob.block(a)
    err = await _api_error(alice.request_friend(b))
    assert (err.status, err.code) == (403, "blocked"), err
    assert (await bob.friend_requests())["incoming"] == []
    assert (await alice.friend_requests())["outgoing"] == []
    # while the block stands I cannot accept their request either; lifted, I can
    rid = await bob.request_friend(a)
    err = await _api_error(alice.accept_friend(rid))
    assert (err.status, err.code) == (403, "blocked"), err
    await bob.unblock(a)
    assert await alice.accept_friend(rid) == single_conv_id(a, b)
    # a request whose sender blocked me after sending it: the same
    rid = await carol.request_friend(a)
    await carol.block(a)
    err = await _api_error(alice.accept_friend(rid))
    assert (err.status, err.code) == (403, "blocked"), err
    assert [f["user_id"] for f in await alice.friends()] == [b]
    await carol.unblock(a)
    assert await alice.accept_friend(rid) == single_conv_id(a, c)


# -- clear and hide (my side only) --------------------------------------------------------------


async def test_clear_is_one_sided(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    await _send(alice, conv, "m1")
    await _send(bob, conv, "m2")
    await _send(bob, conv, "m3")
    await _persisted(alice, conv, 3)
    assert await _unread(alice, conv) == 2, "cursor falls back to my last sent seq (1)"

    await alice.clear(conv)

    mine = await alice.history(conv)
    assert mine["messages"] == [] and mine["min_seq"] == 4, mine
    assert (await alice.history(conv, begin=1, end=3))["messages"] == []
    st = await _state(alice, conv)
    assert st is not None and st["min_seq"] == 4 and st["last_message"] is None, st
    assert await _unread(alice, conv) == 0, "cleared messages are outside my window"
    # the other side is untouched
    assert _seqs(await bob.history(conv)) == [1, 2, 3]
    theirs = await _state(bob, conv)
    assert theirs is not None and theirs["min_seq"] == 1 and theirs["max_seq"] == 3, theirs

    assert await _send(bob, conv, "m4") == 4
    await _persisted(alice, conv, 4)
    assert _seqs(await alice.history(conv)) == [4]
    assert await _unread(alice, conv) == 1
    st = await _state(alice, conv)
    assert st is not None and st["last_message"]["seq"] == 4, st
    assert _seqs(await bob.history(conv)) == [1, 2, 3, 4]


async def test_hide_until_new_message(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    await _send(bob, conv, "m1")
    await _persisted(alice, conv, 1)
    assert await _state(alice, conv) is not None

    r = await _raw(alice, "DELETE", "/v1/conversations/" + conv)
    assert r.status_code == 204, r.text

    assert await _state(alice, conv) is None, "hidden from my list"
    assert await _state(bob, conv) is not None, "the other side is unaffected"
    # hiding is not clearing: the history is still mine
    assert _seqs(await alice.history(conv)) == [1]

    await _send(bob, conv, "m2")
    await _persisted(alice, conv, 2)

    async def back() -> dict[str, Any] | None:
        return await _state(alice, conv)

    st = await eventually(back)
    assert st["last_message"]["seq"] == 2 and st["min_seq"] == 1, st
    assert _seqs(await alice.history(conv)) == [1, 2]


async def test_strangers_cannot_chat(alice: Client, bob: Client) -> None:
    """Before any friendship: no history to read, sends answer not_friends."""
    assert alice.user_id is not None and bob.user_id is not None
    conv = single_conv_id(alice.user_id, bob.user_id)
    err = await _api_error(alice.history(conv))
    assert err.status in (403, 404), err
    ack_err = await _api_error(alice.send_rest(conv, "not yet"))
    assert (ack_err.status, ack_err.code) == (403, "not_friends"), ack_err
    await befriend(alice, bob)
    assert await _send(alice, conv, "now") == 1


async def test_friends_of_the_larger_id_are_found_by_an_index(
    alice: Client, bob: Client, stores: Stores, server: Any
) -> None:
    """Both halves of "friends of u" (u as the smaller or the larger id of the pair) are
    index scans: with sequential scans off, the plan names an index, never the table."""
    await befriend(alice, bob)
    u = max(alice.user_id, bob.user_id)
    async with pg(stores) as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN SELECT user_b FROM friendships WHERE user_a = $1"
                " UNION ALL SELECT user_a FROM friendships WHERE user_b = $1",
                u,
            )
        )
    assert "Seq Scan" not in plan, plan
    assert "friendships_b" in plan, plan


async def test_decline_and_cancel(alice: Client, bob: Client, carol: Client) -> None:
    """Declining a request to me, or cancelling one I sent, takes it off both lists and
    makes nobody friends; doing it twice changes nothing; the sender may ask again; an
    accepted request can be neither (``conflict``); only the receiver declines and only
    the sender cancels (404 for anyone else, the request stays)."""
    bid, cid = int(bob.user_id or 0), int(carol.user_id or 0)  # type: ignore[arg-type]
    r1 = await alice.request_friend(bid, "hi bob")
    r2 = await alice.request_friend(cid, "hi carol")
    for wrong in (
        alice.decline_friend(r1),  # the sender cannot decline
        bob.cancel_friend_request(r1),  # the receiver cannot cancel
        carol.decline_friend(r1),
        carol.cancel_friend_request(r1),
    ):
        assert (await _api_error(wrong)).status == 404
    assert [r["request_id"] for r in (await bob.friend_requests())["incoming"]] == [r1]

    await bob.decline_friend(r1)
    await bob.decline_friend(r1)  # twice: no change
    assert (await bob.friend_requests())["incoming"] == []
    assert [r["request_id"] for r in (await alice.friend_requests())["outgoing"]] == [r2]
    assert (await _api_error(bob.accept_friend(r1))).status == 404  # declined: gone
    assert await alice.friends() == [] and await bob.friends() == []

    await alice.cancel_friend_request(r2)
    await alice.cancel_friend_request(r2)
    assert (await carol.friend_requests())["incoming"] == []
    assert (await alice.friend_requests())["outgoing"] == []
    assert await carol.friends() == []

    # asking again makes a new pending request, which can be accepted
    r3 = await alice.request_friend(bid, "again")
    assert r3 != r1
    await bob.accept_friend(r3)
    for late in (bob.decline_friend(r3), alice.cancel_friend_request(r3)):
        e = await _api_error(late)
        assert (e.status, e.code) == (409, "conflict")
    assert [f["user_id"] for f in await alice.friends()] == [bid]


async def test_blocking_declines_their_pending_request(alice: Client, bob: Client) -> None:
    """Blocking someone also declines their pending request to me (my list no longer
    shows it); they cannot ask again while blocked."""
    aid = int(alice.user_id or 0)  # type: ignore[arg-type]
    await bob.request_friend(aid, "hi")
    await alice.block(int(bob.user_id or 0))  # type: ignore[arg-type]
    assert (await alice.friend_requests())["incoming"] == []
    assert (await bob.friend_requests())["outgoing"] == []
    e = await _api_error(bob.request_friend(aid))
    assert e.code == "blocked"
