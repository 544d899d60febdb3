"""History over REST: GET /v1/conversations/{conv_id}/messages against the contract.

Each test gets a fresh pair of friends with N messages, waits until the persister has
written them all (history reads PostgreSQL), then checks one rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest

from im_server.client import ApiError, Client
from tests.support import Stores, befriend, eventually, new_user

N = 30


async def _send_many(client: Client, conv: str, n: int) -> list[dict[str, Any]]:
    conn = await client.connect()
    try:
        acks = [await conn.send(conv, f"m{i}") for i in range(1, n + 1)]
    finally:
        await conn.close()
    assert all(a["ok"] for a in acks), acks
    return acks


async def _persisted(client: Client, conv: str, n: int) -> None:
    async def check() -> bool:
        data = await client.history(conv, limit=500)
        return data["max_seq"] >= n and len(data["messages"]) >= n

    await eventually(check, timeout=15.0)


@pytest.fixture
async def chat(pair: tuple[Client, Client, str]) -> tuple[Client, Client, str]:
    """alice and bob, friends, with seqs 1..N (alice sent the odd ones, bob the even)."""
    alice, bob, conv = pair
    ca, cb = await alice.connect(), await bob.connect()
    try:
        for i in range(1, N + 1):
            ack = await (ca if i % 2 else cb).send(conv, f"m{i}")
            assert ack["ok"] is True and ack["seq"] == i, ack
    finally:
        await ca.close()
        await cb.close()
    await _persisted(alice, conv, N)
    await _persisted(bob, conv, N)
    return alice, bob, conv


@pytest.fixture
async def carol(url: str) -> AsyncIterator[Client]:
    c = await new_user(url, "carol")
    yield c
    await c.aclose()


def seqs(data: dict[str, Any]) -> list[int]:
    return [m["seq"] for m in data["messages"]]


def path(conv: str) -> str:
    # the query goes in ``params=`` (Client.request's own), never written into the path
    return "/v1/conversations/" + quote(conv, safe=":") + "/messages"


# -- order, window bounds, message shape ---------------------------------------------------


async def test_default_asc_returns_all_in_order(chat: tuple[Client, Client, str]) -> None:
    alice, bob, conv = chat
    data = await alice.history(conv)
    assert seqs(data) == list(range(1, N + 1))
    assert data["min_seq"] == 1 and data["max_seq"] == N
    assert data["is_end"] is True
    for m in data["messages"]:
        assert m["conv_id"] == conv
        assert m["content_type"] == "text" and m["content"] == {"text": f"m{m['seq']}"}
        assert m["sender_id"] == (alice.user_id if m["seq"] % 2 else bob.user_id)
        assert m["recalled"] is False
        assert isinstance(m["server_time"], int) and isinstance(m["client_msg_id"], str)
    # both sides see the same thing
    assert (await bob.history(conv)) == data


async def test_desc_order(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    data = await alice.history(conv, order="desc")
    assert seqs(data) == list(range(N, 0, -1))
    assert data["is_end"] is True
    assert data["min_seq"] == 1 and data["max_seq"] == N


async def test_inner_range_both_orders(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    asc = await alice.history(conv, begin=5, end=12)
    assert seqs(asc) == list(range(5, 13))
    assert asc["is_end"] is False  # seqs after 12 exist
    desc = await alice.history(conv, begin=5, end=12, order="desc")
    assert seqs(desc) == list(range(12, 4, -1))
    assert desc["is_end"] is False  # seqs before 5 exist
    assert desc["min_seq"] == 1 and desc["max_seq"] == N

    at_start = await alice.history(conv, begin=1, end=4, order="desc")
    assert seqs(at_start) == [4, 3, 2, 1] and at_start["is_end"] is True
    at_end = await alice.history(conv, begin=27, end=N)
    assert seqs(at_end) == [27, 28, 29, 30] and at_end["is_end"] is True


# -- limit: truncation keeps the seqs nearest end --------------------------------------------


async def test_limit_keeps_nearest_end_asc(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    data = await alice.history(conv, begin=1, end=20, limit=5)
    assert seqs(data) == [16, 17, 18, 19, 20]
    assert data["is_end"] is False

    data = await alice.history(conv, limit=5)  # whole window
    assert seqs(data) == [26, 27, 28, 29, 30]
    assert data["is_end"] is True


async def test_limit_keeps_nearest_end_desc(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    data = await alice.history(conv, begin=1, end=20, limit=5, order="desc")
    assert seqs(data) == [20, 19, 18, 17, 16]
    assert data["is_end"] is False  # truncated: seqs 1..15 remain before

    data = await alice.history(conv, limit=5, order="desc")
    assert seqs(data) == [30, 29, 28, 27, 26]
    assert data["is_end"] is False

    data = await alice.history(conv, begin=1, end=5, limit=5, order="desc")
    assert seqs(data) == [5, 4, 3, 2, 1]
    assert data["is_end"] is True


async def test_limit_above_cap_is_accepted(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    for order in ("asc", "desc"):
        data = await alice.history(conv, limit=100_000, order=order)
        expected = list(range(1, N + 1))
        assert seqs(data) == (expected if order == "asc" else expected[::-1])
        assert data["is_end"] is True
    data = await alice.request("GET", path(conv), params={"limit": 2**63 - 1})
    assert seqs(data) == list(range(1, N + 1))


async def test_default_limit_is_50(pair: tuple[Client, Client, str]) -> None:
    alice, _, conv = pair
    await _send_many(alice, conv, 60)
    await _persisted(alice, conv, 60)
    data = await alice.history(conv)
    assert seqs(data) == list(range(11, 61))
    assert data["is_end"] is True
    data = await alice.history(conv, order="desc")
    assert seqs(data) == list(range(60, 10, -1))
    assert data["is_end"] is False


# -- clamping and ranges outside the window ---------------------------------------------------


async def test_clamping(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    data = await alice.history(conv, begin=0, end=10)
    assert seqs(data) == list(range(1, 11))
    data = await alice.history(conv, begin=0, end=10, order="desc")
    assert seqs(data) == list(range(10, 0, -1)) and data["is_end"] is True

    data = await alice.history(conv, begin=25, end=10_000)
    assert seqs(data) == list(range(25, N + 1)) and data["is_end"] is True
    data = await alice.history(conv, begin=25, end=2**63 - 1, order="desc")
    assert seqs(data) == list(range(N, 24, -1)) and data["is_end"] is False

    data = await alice.history(conv, begin=0, end=2**63 - 1)
    assert seqs(data) == list(range(1, N + 1))
    assert data["min_seq"] == 1 and data["max_seq"] == N and data["is_end"] is True


async def test_range_above_window_is_empty(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    data = await alice.history(conv, begin=N + 1, end=N + 100)
    assert data["messages"] == []
    assert data["is_end"] is True  # asc: nothing after
    assert data["min_seq"] == 1 and data["max_seq"] == N

    data = await alice.history(conv, begin=1000, order="desc")
    assert data["messages"] == []
    assert data["is_end"] is False  # desc: seqs 1..30 exist before
    assert data["min_seq"] == 1 and data["max_seq"] == N


async def test_range_below_window_is_empty(
    pair: tuple[Client, Client, str], stores: Stores
) -> None:
    """The seed's question: my window starts above the requested range. The window is
    moved in PostgreSQL (as a clear would) so that only the history path is under test."""
    alice, bob, conv = pair
    await _send_many(bob, conv, 10)
    await _persisted(alice, conv, 10)
    pg = await asyncpg.connect(stores.pg.url.replace("+asyncpg", ""))
    try:
        await pg.execute(
            "UPDATE conv_members SET min_seq = 6 WHERE conv_id = $1 AND user_id = $2",
            conv,
            alice.user_id,
        )
    finally:
        await pg.close()

    whole = await alice.history(conv)
    assert seqs(whole) == [6, 7, 8, 9, 10]
    assert whole["min_seq"] == 6 and whole["max_seq"] == 10 and whole["is_end"] is True

    asc = await alice.history(conv, begin=1, end=5)
    assert asc["messages"] == [] and asc["is_end"] is False
    assert asc["min_seq"] == 6 and asc["max_seq"] == 10
    desc = await alice.history(conv, begin=1, end=5, order="desc")
    assert desc["messages"] == [] and desc["is_end"] is True
    assert desc["min_seq"] == 6 and desc["max_seq"] == 10

    # straddling the lower bound: clamped to it
    part = await alice.history(conv, begin=1, end=7, order="desc")
    assert seqs(part) == [7, 6] and part["is_end"] is True

    # bob's window is his own
    assert seqs(await bob.history(conv)) == list(range(1, 11))


async def test_empty_conversation(pair: tuple[Client, Client, str]) -> None:
    alice, _, conv = pair
    for order in ("asc", "desc"):
        data = await alice.history(conv, order=order)
        assert data["messages"] == []
        assert data["is_end"] is True
        assert data["max_seq"] == 0 and data["min_seq"] == 1


# -- paging -------------------------------------------------------------------------------------


async def test_paging_back_desc_collects_every_seq_once(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    got: list[int] = []
    end: int | None = None
    for _ in range(N + 5):
        data = await alice.history(conv, end=end, limit=7, order="desc")
        page = seqs(data)
        assert page == sorted(page, reverse=True)
        got.extend(page)
        if data["is_end"]:
            break
        assert page, "a page that is not the end must not be empty"
        end = page[-1] - 1
    else:
        pytest.fail("paging back never reached is_end")
    assert got == list(range(N, 0, -1))


async def test_paging_forward_asc_collects_every_seq_once(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    got: list[int] = []
    begin = 1
    for _ in range(N + 5):
        data = await alice.history(conv, begin=begin, end=begin + 6, limit=7)
        page = seqs(data)
        got.extend(page)
        if data["is_end"]:
            break
        begin = page[-1] + 1
    else:
        pytest.fail("paging forward never reached is_end")
    assert got == list(range(1, N + 1))


# -- bad requests -------------------------------------------------------------------------------

BAD_QUERIES = [
    {"begin": 5, "end": 2},
    {"begin": -1},
    {"end": -1},
    {"begin": -3, "end": 5},
    {"limit": -5},
    {"limit": 0},
    {"begin": "abc"},
    {"end": "1.5"},
    {"limit": "ten"},
    {"begin": "1e3"},
    {"begin": "99999999999999999999"},
    {"order": "up"},
    {"order": "DESC"},
    {"order": ""},
]


@pytest.mark.parametrize(
    "query", BAD_QUERIES, ids=lambda q: "&".join(f"{k}={v}" for k, v in q.items())
)
async def test_bad_query_is_400(chat: tuple[Client, Client, str], query: dict[str, Any]) -> None:
    alice, _, conv = chat
    with pytest.raises(ApiError) as exc:
        await alice.request("GET", path(conv), params=query)
    assert exc.value.status == 400
    assert exc.value.code == "bad_request"
    assert exc.value.message


async def test_error_body_shape(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    resp = await alice.http.get(
        alice.base_url + path(conv),
        params={"begin": 5, "end": 2},
        headers={"Authorization": f"Bearer {alice.token}"},
    )
    assert resp.status_code == 400
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "bad_request" and isinstance(body["error"]["message"], str)


# -- who may read ---------------------------------------------------------------------------------


async def test_outsider_gets_not_member(chat: tuple[Client, Client, str], carol: Client) -> None:
    _, _, conv = chat
    with pytest.raises(ApiError) as exc:
        await carol.history(conv)
    assert exc.value.status == 403 and exc.value.code == "not_member"
    with pytest.raises(ApiError) as exc:
        await carol.history(conv, begin=1, end=5, order="desc")
    assert exc.value.status == 403 and exc.value.code == "not_member"


async def test_outsider_with_own_friendship_still_refused(
    chat: tuple[Client, Client, str], carol: Client
) -> None:
    alice, _, conv = chat
    await befriend(carol, alice)  # carol is alice's friend, but not in the alice-bob chat
    with pytest.raises(ApiError) as exc:
        await carol.history(conv)
    assert exc.value.status == 403 and exc.value.code == "not_member"


async def test_unknown_group_is_404(alice: Client) -> None:
    with pytest.raises(ApiError) as exc:
        await alice.history(f"g:{2**62}")
    assert exc.value.status == 404 and exc.value.code == "not_found"


@pytest.mark.parametrize(
    "conv_id",
    [
        "s:2:1",
        "s:1:1",
        "s:0:1",
        "x:1",
        "g:0",
        "g:01",
        "s:01:2",
        "g:abc",
        f"g:{2**63}",
        "nonsense",
        "g:1\n",
    ],
)
async def test_malformed_conv_id_is_400(alice: Client, conv_id: str) -> None:
    with pytest.raises(ApiError) as exc:
        await alice.history(conv_id)
    assert exc.value.status == 400 and exc.value.code == "bad_request"


async def test_own_conv_id_with_trailing_newline_is_400(chat: tuple[Client, Client, str]) -> None:
    """``s:<a>:<b>\\n`` is not the contract's shape: it must be refused, not looked up."""
    alice, _, conv = chat
    with pytest.raises(ApiError) as exc:
        await alice.history(conv + "\n")
    assert exc.value.status == 400 and exc.value.code == "bad_request"


async def test_history_needs_a_token(chat: tuple[Client, Client, str]) -> None:
    alice, _, conv = chat
    anon = Client(alice.base_url)
    try:
        with pytest.raises(ApiError) as exc:
            await anon.history(conv)
        assert exc.value.status == 401 and exc.value.code == "unauthorized"
    finally:
        await anon.aclose()
