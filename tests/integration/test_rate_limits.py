"""Per-user rate limits on sends, read reports, typing and searches, the cap on WebSockets per
user, and the server API's limit per key, against a dedicated server started with low limits. A refused request is answered
(``rate_limited``), takes no seq, moves no cursor, and never costs the connection."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from im_server.client import ApiError, Client, Connection, ServerClient
from im_server.client.transport import Response
from tests.support import ServerProcess, Stores, api_key, befriend, eventually, new_user

SEND_PER_S, SEND_BURST = 5, 10
READ_PER_S, READ_BURST = 5, 10
TYPING_PER_S, TYPING_BURST = 1, 2
MEMBERS_PER_S, MEMBERS_BURST = 0.2, 3
SEARCH_PER_S, SEARCH_BURST = 0.5, 4
SERVER_API_PER_S, SERVER_API_BURST = 2, 4
MAX_CONNS = 3

LIMITS = {
    "IM_RATE_SEND_PER_S": str(SEND_PER_S),
    "IM_RATE_SEND_BURST": str(SEND_BURST),
    "IM_RATE_READ_PER_S": str(READ_PER_S),
    "IM_RATE_READ_BURST": str(READ_BURST),
    "IM_RATE_TYPING_PER_S": str(TYPING_PER_S),
    "IM_RATE_TYPING_BURST": str(TYPING_BURST),
    "IM_RATE_MEMBERS_PER_S": str(MEMBERS_PER_S),
    "IM_RATE_MEMBERS_BURST": str(MEMBERS_BURST),
    "IM_RATE_SEARCH_PER_S": str(SEARCH_PER_S),
    "IM_RATE_SEARCH_BURST": str(SEARCH_BURST),
    "IM_RATE_SERVER_API_PER_S": str(SERVER_API_PER_S),
    "IM_RATE_SERVER_API_BURST": str(SERVER_API_BURST),
    "IM_MAX_CONNECTIONS_PER_USER": str(MAX_CONNS),
}


@pytest.fixture(scope="module")
def limited(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**stores.env(), **LIMITS}).start()
    yield srv
    srv.terminate()


@pytest.fixture
async def duo(limited: ServerProcess) -> AsyncIterator[tuple[Client, Client, str]]:
    a, b = await new_user(limited.url, "alice"), await new_user(limited.url, "bob")
    conv = await befriend(a, b)
    yield a, b, conv
    await a.aclose()
    await b.aclose()


def _log(srv: ServerProcess) -> str:
    return "\nserver log:\n" + srv.log_tail(20)


async def _state(c: Client, conv: str) -> dict[str, Any]:
    return next(s for s in await c.conversations() if s["conv_id"] == conv)


async def _errors(conn: Connection, settle: float = 0.3) -> list[dict[str, Any]]:
    """Every error frame that arrives until the socket has been quiet for ``settle`` s."""
    await conn.ping()
    out = []
    while (ev := await conn.try_next_event("error", timeout=settle)) is not None:
        out.append(ev)
    return out


async def _rest_send(c: Client, conv: str) -> Response:
    body = {"client_msg_id": uuid.uuid4().hex, "content_type": "text", "content": {"text": "rest"}}
    return await c.http.post(
        f"{c.base_url}/v1/conversations/{conv}/messages",
        json=body,
        headers={"Authorization": f"Bearer {c.token}"},
    )


async def test_send_burst_is_limited_and_refusals_take_no_seq(
    duo: tuple[Client, Client, str], limited: ServerProcess
) -> None:
    alice, bob, conv = duo
    conn = await alice.connect()
    started = time.monotonic()
    futs = [await conn.send_nowait(conv, f"burst {i}") for i in range(30)]
    acks = await asyncio.gather(*futs)
    elapsed = time.monotonic() - started
    ok = [a for a in acks if a["ok"]]
    refused = [a for a in acks if not a["ok"]]
    # the burst, plus what refilled while the 30 frames were handled
    most = SEND_BURST + int(elapsed * SEND_PER_S) + 1
    assert SEND_BURST <= len(ok) <= most, (len(ok), elapsed, acks)
    assert all(a["ok"] for a in acks[:SEND_BURST]), acks[:SEND_BURST]
    for a in refused:
        assert a["code"] == "rate_limited" and a["message"], a
        assert "seq" not in a or a["seq"] is None, a
    assert sorted(a["seq"] for a in ok) == list(range(1, len(ok) + 1)), "refusals must take no seq"
    await conn.ping()
    assert not conn.closed.is_set()

    # the REST twin shares the bucket: 429 rate_limited while it is empty
    statuses = []
    rest_seqs = []
    for _ in range(3):
        r = await _rest_send(alice, conv)
        statuses.append(r.status_code)
        if r.status_code == 200:
            rest_seqs.append(r.json()["seq"])
        else:
            assert r.status_code == 429, (r.status_code, r.text)
            assert r.json()["error"]["code"] == "rate_limited", r.text
    assert 429 in statuses, statuses

    # another user is not limited by alice's burst
    other = await bob.connect()
    bob_ack = await other.send(conv, "bob is fine")
    assert bob_ack["ok"] is True, bob_ack

    # after a pause the bucket has refilled
    await asyncio.sleep(1.1)  # under test: the refill over time
    again = [await conn.send(conv, f"after pause {i}") for i in range(SEND_PER_S)]
    assert all(a["ok"] for a in again), again
    every = sorted(
        [a["seq"] for a in ok] + rest_seqs + [bob_ack["seq"]] + [a["seq"] for a in again]
    )
    # all seqs dense: none was taken by a refusal
    assert every == list(range(1, len(every) + 1)), every

    async def persisted() -> list[dict[str, Any]] | None:
        msgs = (await bob.history(conv, limit=200))["messages"]
        return msgs if len(msgs) >= len(every) else None

    msgs = await eventually(persisted)
    assert [m["seq"] for m in msgs] == every, [m["seq"] for m in msgs]
    assert sum(1 for m in msgs if m["content"]["text"].startswith("burst")) == len(ok)
    await conn.ping()
    assert not conn.closed.is_set(), _log(limited)
    await conn.close()
    await other.close()


async def test_reaction_toggles_share_the_send_bucket_and_refusals_append_nothing(
    duo: tuple[Client, Client, str],
) -> None:
    """A reaction appends a notice to the seq stream as a send does: a burst of toggles
    draws on the same bucket, and a refused toggle changes nothing."""
    alice, bob, conv = duo
    first = await alice.send_rest(conv, "react to me")
    seq = int(first["seq"])
    done, refused, reacted = 0, 0, False
    started = time.monotonic()
    for _ in range(3 * SEND_BURST):
        # a true toggle (from the state it is in, not by turn): a refused one leaves the
        # state as it was, and the next try repeats it, so every accepted call is a change
        try:
            await (bob.unreact if reacted else bob.react)(conv, seq, "👍")
            done += 1
            reacted = not reacted
        except ApiError as e:
            assert (e.status, e.code) == (429, "rate_limited"), e
            refused += 1
    elapsed = time.monotonic() - started
    assert refused > 0 and SEND_BURST <= done <= SEND_BURST + int(elapsed * SEND_PER_S) + 2
    # the bucket is bob's, for sends too: sends right after the burst are refused (three
    # tries: one token may have refilled meanwhile)
    codes = []
    for _ in range(3):
        try:
            await bob.send_rest(conv, "after the toggles")
            codes.append("ok")
        except ApiError as e:
            codes.append(e.code)
    assert "rate_limited" in codes, codes

    async def notices() -> list[int] | None:
        msgs = (await alice.history(conv, limit=200))["messages"]
        found = [m["seq"] for m in msgs if m["content_type"] == "reaction"]
        return found if len(found) >= done else None

    # one notice per accepted toggle, none for a refused one, seqs dense after the message
    assert await eventually(notices) == list(range(seq + 1, seq + 1 + done))
    await asyncio.sleep(0.5)  # under test: nothing more arrives late
    assert len(await notices() or []) == done


async def test_read_reports_are_limited_and_refusals_move_no_cursor(
    duo: tuple[Client, Client, str], limited: ServerProcess
) -> None:
    alice, bob, conv = duo
    sender = await alice.connect()
    acks = [await sender.send(conv, f"m{i}") for i in range(10)]
    assert [a["seq"] for a in acks] == list(range(1, 11)), acks
    conn = await bob.connect()
    # spend the whole read budget on seq 1
    for _ in range(READ_BURST):
        await conn.read(conv, 1)
    await conn.ping()
    # REST read while the bucket is empty: 429, and the cursor stays at 1
    with pytest.raises(ApiError) as refused:
        await bob.read_rest(conv, 10)
    assert (refused.value.status, refused.value.code) == (429, "rate_limited")
    # more reports, each one further: the refused ones must not move the cursor
    for seq in range(2, 11):
        await conn.read(conv, seq)
    errors = await _errors(conn)
    assert errors and all(e["code"] == "rate_limited" and e["message"] for e in errors), errors
    accepted = 9 - len(errors)
    assert accepted <= 3, (accepted, errors)  # refills at 5/s while the frames are handled

    async def flushed() -> dict[str, Any] | None:
        """The accepted reports are durable (the cursor batcher's group commit); refused
        ones never reach the batcher, so nothing can move the cursor further later."""
        st_ = await _state(bob, conv)
        return st_ if st_["read_seq"] >= 1 + accepted else None

    st = await eventually(flushed)
    assert st["read_seq"] == 1 + accepted, (st, len(errors))
    assert st["unread"] == 10 - (1 + accepted), st

    # delivered reports share the read bucket
    for seq in range(1, 13):
        await conn.delivered(conv, seq)
    errs = await _errors(conn)
    assert any(e["code"] == "rate_limited" for e in errs), errs

    # after a pause, reports work again
    await asyncio.sleep(1.1)  # under test: the refill over time
    await conn.read(conv, 10)
    assert await _errors(conn, 0.2) == []

    async def moved() -> bool:
        return (await _state(bob, conv))["read_seq"] == 10

    await eventually(moved)
    assert (await bob.read_rest(conv, 10))["read_seq"] == 10
    await conn.ping()
    assert not conn.closed.is_set(), _log(limited)
    await conn.close()
    await sender.close()


async def test_typing_is_limited(duo: tuple[Client, Client, str], limited: ServerProcess) -> None:
    alice, bob, conv = duo
    conn = await alice.connect()
    peer = await bob.connect()
    started = time.monotonic()
    for _ in range(6):
        await conn.typing(conv)
    errors = await _errors(conn)
    elapsed = time.monotonic() - started
    assert all(e["code"] == "rate_limited" and e["message"] for e in errors), errors
    passed = 6 - len(errors)
    assert TYPING_BURST <= passed <= TYPING_BURST + int(elapsed * TYPING_PER_S) + 1, (
        passed,
        elapsed,
    )
    seen = []
    while (ev := await peer.try_next_event("typing", timeout=0.3)) is not None:
        seen.append(ev)
    assert len(seen) == passed, (seen, errors)
    await conn.ping()
    assert not conn.closed.is_set(), _log(limited)
    await conn.close()
    await peer.close()


async def test_member_changes_are_limited(limited: ServerProcess) -> None:
    """Creating groups and adding members share one budget per user; a refused add
    changes nothing."""
    owner = await new_user(limited.url, "own")
    others = [await new_user(limited.url, f"m{i}") for i in range(3)]
    ids = [int(o.user_id) for o in others]  # type: ignore[arg-type]
    gid = (await owner.create_group("limited", ids[:1]))["group_id"]
    assert (await owner.add_members(gid, ids[1:2]))["added"] == ids[1:2]
    assert (await owner.add_members(gid, ids[1:2]))["added"] == []  # a no-op still costs
    with pytest.raises(ApiError) as e:
        await owner.add_members(gid, ids[2:])
    assert (e.value.status, e.value.code) == (429, "rate_limited")
    assert int(ids[2]) not in {m["user_id"] for m in await owner.members(gid)}
    for c in (owner, *others):
        await c.aclose()


async def test_searches_are_limited_per_user(duo: tuple[Client, Client, str]) -> None:
    a, b, conv = duo
    answers = []
    for _ in range(SEARCH_BURST + 2):
        try:
            answers.append(len((await a.search("hello"))["results"]))
        except ApiError as e:
            answers.append((e.status, e.code))
    assert answers[:SEARCH_BURST] == [0] * SEARCH_BURST, answers
    assert answers[SEARCH_BURST:] == [(429, "rate_limited")] * 2, answers
    # another user's bucket is its own; bad input is refused before it counts
    assert (await b.search("hello"))["results"] == []
    with pytest.raises(ApiError) as ei:
        await a.search("   ")
    assert (ei.value.status, ei.value.code) == (400, "bad_request")
    # tokens come back with time
    await asyncio.sleep(1 / SEARCH_PER_S + 0.2)
    assert (await a.search("hello"))["results"] == []


async def test_connection_cap_per_user(limited: ServerProcess) -> None:
    carol = await new_user(limited.url, "carol")
    dave = await new_user(limited.url, "dave")
    conns = [await carol.connect() for _ in range(MAX_CONNS)]
    for c in conns:
        await c.ping()
    extra = await carol.connect()
    assert await extra.wait_closed(5) == 1008
    for c in conns:  # the first three are untouched
        await c.ping()
        assert not c.closed.is_set()
    # the cap is per user: another user connects fine
    d = await dave.connect()
    await d.ping()
    # a freed slot can be used again
    await conns[0].close()

    async def reconnects() -> Connection | None:
        c = await carol.connect()
        try:
            await c.ping(timeout=2)
            return c
        except Exception:  # noqa: BLE001 - the slot was not freed yet
            return None

    again = await eventually(reconnects, timeout=5, interval=0.2)
    for c in (*conns[1:], again, d):
        await c.ping()
        await c.close()
    await carol.aclose()
    await dave.aclose()


async def test_server_api_requests_are_limited_per_key(
    limited: ServerProcess, stores: Stores
) -> None:
    """A key over its rate is answered 429 and its request changes nothing; another key
    is not held back; the key is served again once its bucket refills."""
    run = uuid.uuid4().hex[:8]
    async with (
        ServerClient(limited.url, await api_key(stores)) as app,
        ServerClient(limited.url, await api_key(stores)) as other,
    ):
        for i in range(SERVER_API_BURST):
            await app.put_user(f"rl-{run}-{i}")
        with pytest.raises(ApiError) as refused:
            await app.put_user(f"rl-{run}-over")
        assert (refused.value.status, refused.value.code) == (429, "rate_limited"), _log(limited)
        with pytest.raises(ApiError) as missing:
            await other.get_user(f"rl-{run}-over")
        assert missing.value.status == 404  # the refused request made no user
        assert (await other.get_user(f"rl-{run}-0"))["external_id"] == f"rl-{run}-0"
        await asyncio.sleep(1.5 / SERVER_API_PER_S)
        assert (await app.put_user(f"rl-{run}-over"))["external_id"] == f"rl-{run}-over"
