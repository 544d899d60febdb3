"""Pure logic of the client: SyncState arithmetic, and Device driven by a fake server.

No network: the fake client below answers ``sync`` and ``history`` the way PROTOCOL.md
describes (clamping to the window, ``limit`` keeping the seqs nearest ``end``, sync pages
with ``has_more``), so the recipe can be checked without a running server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from im_server.client import ApiError, Client, Device, HttpPool, SyncState, single_conv_id

C = "s:1:2"
G = "g:7"


def msg(seq: int, conv: str = C) -> dict[str, Any]:
    return {
        "conv_id": conv,
        "seq": seq,
        "sender_id": 1,
        "client_msg_id": f"m{seq}",
        "content_type": "text",
        "content": {"text": str(seq)},
        "server_time": 0,
        "recalled": False,
        "edited_at": None,
        "reactions": [],
    }


def state_of(conv: str, min_seq: int, max_seq: int, embedded: range | list[int] = ()) -> dict:
    return {
        "conv_id": conv,
        "min_seq": min_seq,
        "max_seq": max_seq,
        "messages": [msg(s, conv) for s in embedded],
    }


def sync_answer(version: int, *states: dict, has_more: bool = False) -> dict:
    return {"version": version, "conversations": list(states), "has_more": has_more}


def feed(st: SyncState, resp: dict) -> list[tuple[str, int, int]]:
    """What a device does with a sync answer: ranges, then the embedded messages."""
    ranges = st.apply_sync(resp)
    for conv in resp["conversations"]:
        st.add_messages(conv["messages"])
    return ranges


# -- helpers --------------------------------------------------------------------------


def test_single_conv_id_is_ordered() -> None:
    assert single_conv_id(9, 3) == "s:3:9" == single_conv_id(3, 9)


def test_api_error_parses_contract_body_and_falls_back() -> None:
    err = ApiError.from_response(403, b'{"error": {"code": "not_friends", "message": "no"}}')
    assert (err.status, err.code, err.message) == (403, "not_friends", "no")
    err = ApiError.from_response(503, b"<html>bad gateway</html>")
    assert (err.status, err.code) == (503, "unavailable")


# -- duplicates -----------------------------------------------------------------------


def test_add_messages_drops_duplicates_within_and_across_batches() -> None:
    st = SyncState()
    first = st.add_messages([msg(1), msg(2), msg(2), msg(3)])
    assert [m["seq"] for m in first] == [1, 2, 3]
    again = st.add_messages([msg(3), msg(4), msg(1)])
    assert [m["seq"] for m in again] == [4]
    assert (C, 4) in st and (C, 5) not in st
    assert st.contiguous(C) == 4
    # same seq in another conversation is a different message
    assert [m["seq"] for m in st.add_messages([msg(1, G)])] == [1]


def test_add_messages_out_of_order_tracks_contiguous() -> None:
    st = SyncState()
    st.add_messages([msg(3), msg(5)])
    assert st.contiguous(C) == 0
    st.add_messages([msg(1), msg(2)])
    assert st.contiguous(C) == 3
    st.add_messages([msg(4)])
    assert st.contiguous(C) == 5


def test_messages_below_min_seq_are_dropped() -> None:
    st = SyncState()
    feed(st, sync_answer(1, state_of(C, 10, 12, range(10, 13))))
    assert st.add_messages([msg(9), msg(10)]) == []
    assert [m["seq"] for m in st.add_messages([msg(13)])] == [13]


# -- ranges from sync -------------------------------------------------------------------


def test_snapshot_ranges_skip_embedded_messages() -> None:
    st = SyncState()
    resp = sync_answer(5, state_of(C, 1, 50, range(31, 51)))
    assert st.apply_sync(resp) == [(C, 1, 30)]
    assert st.version == 5 and st.has_more is False
    new = st.add_messages(resp["conversations"][0]["messages"])
    assert len(new) == 20
    # requested ranges are not handed out twice
    assert st.apply_sync(resp) == []
    st.add_messages([msg(s) for s in range(1, 31)])
    st.mark_pulled(C, 1, 30)
    assert st.contiguous(C) == 50
    assert st.apply_sync(sync_answer(6, state_of(C, 1, 52, [52]))) == [(C, 51, 51)]


def test_ranges_are_bounded_by_min_seq() -> None:
    st = SyncState()
    ranges = st.apply_sync(sync_answer(3, state_of(G, 41, 100, range(81, 101))))
    assert ranges == [(G, 41, 80)]


def test_nothing_to_pull_when_window_is_empty() -> None:
    st = SyncState()
    # cleared conversation: min_seq is past the end
    assert st.apply_sync(sync_answer(2, state_of(C, 31, 30))) == []
    assert st.contiguous(C) == 30


def test_raised_min_seq_prunes_held_messages() -> None:
    st = SyncState()
    st.add_messages([msg(s) for s in range(1, 11)])
    assert st.apply_sync(sync_answer(4, state_of(C, 11, 10))) == []
    assert (C, 5) not in st
    assert st.min_seq(C) == 11 and st.contiguous(C) == 10
    # later messages after the clear point are pulled normally
    assert st.apply_sync(sync_answer(5, state_of(C, 11, 14, [14]))) == [(C, 11, 13)]


def test_ranges_only_cover_holes_between_held_seqs() -> None:
    st = SyncState()
    st.add_messages([msg(s) for s in (1, 2, 5, 6, 9)])
    assert st.apply_sync(sync_answer(1, state_of(C, 1, 10))) == [
        (C, 3, 4),
        (C, 7, 8),
        (C, 10, 10),
    ]


def test_has_more_pages_do_not_overlap_and_version_advances() -> None:
    st = SyncState()
    ranges = feed(st, sync_answer(5, state_of(C, 1, 10, [10]), has_more=True))
    assert st.has_more is True and st.version == 5
    # the same conversation changed again before the second page was fetched
    ranges += feed(st, sync_answer(9, state_of(C, 1, 15, [15]), state_of(G, 1, 3, [1, 2, 3])))
    assert st.has_more is False and st.version == 9
    assert ranges == [(C, 1, 9), (C, 11, 14)]


def test_version_never_goes_back() -> None:
    st = SyncState(version=10)
    st.apply_sync(sync_answer(7))
    assert st.version == 10


def test_release_makes_a_range_claimable_again() -> None:
    st = SyncState()
    assert st.apply_sync(sync_answer(1, state_of(C, 1, 5))) == [(C, 1, 5)]
    assert st.missing(C) == []
    st.release(C, 1, 5)
    assert st.missing(C) == [(C, 1, 5)]


# -- gaps in pushes ---------------------------------------------------------------------


def test_push_in_order_has_no_gap() -> None:
    st = SyncState()
    st.add_messages([msg(1)])
    assert st.on_push(msg(2)) is None
    st.add_messages([msg(2)])
    assert st.on_push(msg(2)) is None  # a duplicate push is no gap either


def test_push_skipping_seqs_returns_gap_once() -> None:
    st = SyncState()
    st.add_messages([msg(1), msg(2)])
    assert st.on_push(msg(6)) == (C, 3, 5)
    st.add_messages([msg(6)])
    # while the gap is being pulled, the next push asks only for what is new
    assert st.on_push(msg(7)) is None
    st.add_messages([msg(7)])
    assert st.on_push(msg(9)) == (C, 8, 8)


def test_push_gap_spans_held_seqs_and_respects_min_seq() -> None:
    st = SyncState()
    st.apply_sync(sync_answer(1, state_of(G, 20, 21, [20, 21])))
    st.add_messages([msg(20, G), msg(21, G), msg(24, G)])
    assert st.on_push(msg(27, G)) == (G, 22, 26)  # 24 is held but inside the span

    st2 = SyncState()
    st2.apply_sync(sync_answer(1, state_of(G, 30, 29)))
    assert st2.on_push(msg(33, G)) == (G, 30, 32)


def test_push_in_unknown_conversation_asks_from_the_start() -> None:
    st = SyncState()
    assert st.on_push(msg(5, G)) == (G, 1, 4)
    # the history answer tells the real window: nothing visible below 5
    st.observe_window(G, min_seq=5)
    st.add_messages([msg(5, G)])
    st.mark_pulled(G, 1, 4)
    assert st.contiguous(G) == 5 and st.missing(G) == []


def test_seq_hole_after_redis_loss_is_resolved_once_pulled() -> None:
    st = SyncState()
    st.add_messages([msg(1), msg(2)])
    assert st.on_push(msg(1000)) == (C, 3, 999)
    st.add_messages([msg(1000)])
    st.add_messages([msg(3)])  # history returned only seq 3: 4..999 never existed
    st.mark_pulled(C, 3, 999)
    assert st.contiguous(C) == 1000
    assert st.on_push(msg(1001)) is None
    assert st.apply_sync(sync_answer(2, state_of(C, 1, 1001, [1001]))) == []


# -- Device against a fake server ---------------------------------------------------------


class FakeConn:
    def __init__(self, on_event: Any) -> None:
        self.on_event = on_event

    async def close(self) -> None:
        pass


class FakeClient:
    """Answers sync/history as the contract says; ``persisted`` lags behind pushes."""

    def __init__(self, convs: dict[str, list[int]], min_seqs: dict[str, int] | None = None):
        self.convs = {c: sorted(seqs) for c, seqs in convs.items()}
        self.min_seqs = min_seqs or {}
        self.changed: dict[str, int] = {c: i + 1 for i, c in enumerate(self.convs)}
        self.history_calls: list[tuple[str, int, int]] = []
        self.conn: FakeConn | None = None
        self.page = 1

    async def connect(self, *, on_event: Any, queue_events: bool = True) -> FakeConn:
        self.conn = FakeConn(on_event)
        return self.conn

    def window(self, conv: str) -> tuple[int, int]:
        seqs = self.convs[conv]
        return self.min_seqs.get(conv, 1), (seqs[-1] if seqs else 0)

    async def sync(self, since: int = 0, recent: int | None = None, **_: Any) -> dict:
        changed = sorted((v, c) for c, v in self.changed.items() if v > since)
        page, rest = changed[: self.page], changed[self.page :]
        states = []
        for _v, c in page:
            lo, hi = self.window(c)
            vis = [s for s in self.convs[c] if s >= lo][-(recent or 20) :]
            states.append(state_of(c, lo, hi, vis))
        version = page[-1][0] if page else since
        return sync_answer(version, *states, has_more=bool(rest))

    async def history(self, conv: str, begin: int, end: int, limit: int, order: str) -> dict:
        assert order == "asc" and begin <= end
        self.history_calls.append((conv, begin, end))
        lo, hi = self.window(conv)
        seqs = [s for s in self.convs[conv] if max(begin, lo) <= s <= min(end, hi)]
        seqs = seqs[-limit:]  # more than limit: keep the seqs nearest end
        return {"messages": [msg(s, conv) for s in seqs], "min_seq": lo, "max_seq": hi}


async def test_device_catch_up_pages_and_drops_duplicates() -> None:
    fake = FakeClient({C: list(range(1, 451)), G: [1, 2, 3]}, min_seqs={G: 2})
    dev = Device(fake)  # type: ignore[arg-type]
    await dev.start()
    assert dev.seqs(C) == list(range(1, 451))
    assert dev.seqs(G) == [2, 3]
    # one sync page per conversation (has_more loop), then asc pages of at most 200
    assert fake.history_calls == [(C, 1, 200), (C, 201, 400), (C, 401, 430)]
    assert dev.state.version == 2
    # nothing changed: a second catch-up finds nothing new
    assert await dev.catch_up() == 0


async def test_device_push_gap_is_pulled_and_counted_once() -> None:
    fake = FakeClient({C: [1, 2]})
    seen: list[int] = []
    dev = Device(fake, on_message=lambda m: seen.append(m["seq"]))  # type: ignore[arg-type]
    await dev.start()
    fake.convs[C] += [3, 4, 5]
    assert fake.conn is not None
    fake.conn.on_event({"type": "message", "message": msg(5)})
    fake.conn.on_event({"type": "message", "message": msg(5)})  # duplicate push
    await dev.drain()
    assert dev.seqs(C) == [1, 2, 3, 4, 5]
    assert sorted(seen) == [1, 2, 3, 4, 5] and len(seen) == 5
    assert fake.history_calls[-1] == (C, 3, 4)
    assert dev.errors == []


async def test_device_gap_retries_until_persisted() -> None:
    fake = FakeClient({C: [1]})
    dev = Device(fake)  # type: ignore[arg-type]
    dev.GAP_RETRY_DELAYS = (0.01, 0.01, 0.01)
    await dev.start()
    assert fake.conn is not None
    # seq 3 is pushed while seq 2 is allocated but not persisted yet
    fake.conn.on_event({"type": "message", "message": msg(3)})
    fake.convs[C] += [2]  # the writer catches up before the retry
    await dev.drain()
    assert dev.seqs(C) == [1, 2, 3]


@pytest.mark.parametrize("recall_first", [False, True])
async def test_device_applies_recall_notice(recall_first: bool) -> None:
    fake = FakeClient({C: [1]})
    dev = Device(fake)  # type: ignore[arg-type]
    await dev.start()
    notice = msg(2) | {"content_type": "recall", "content": {"seq": 1}}
    assert fake.conn is not None
    fake.conn.on_event({"type": "message", "message": notice})
    assert dev.messages[C][1]["recalled"] is True and dev.messages[C][1]["content"] is None


# -- REST plumbing against an in-process server ------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    content: bytes


async def test_rest_calls_shape_requests_and_map_errors() -> None:
    seen: list[Seen] = []

    async def handler(req: web.Request) -> web.Response:
        content = await req.read()
        seen.append(Seen(req.method, req.path, dict(req.query), dict(req.headers), content))
        path = req.path
        if path == "/v1/users":
            return web.json_response({"user_id": 42, "username": "ann"}, status=201)
        if path == "/v1/sessions":
            return web.json_response({"token": "t0k", "user_id": 42, "device_id": "d1"})
        if path == "/v1/blocks/7":
            return web.Response(status=204)
        if path.endswith("/messages") and req.method == "POST":
            body = orjson.loads(content)
            return web.json_response(
                {"error": {"code": "not_friends", "message": body["conv_id"]}}, status=403
            )
        return web.json_response({"messages": [], "min_seq": 1, "max_seq": 0, "is_end": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server, HttpPool() as http:
        base = f"http://127.0.0.1:{server.port}"
        c = await Client.register(base + "/", "ann", "pw", http=http)
        assert (c.token, c.user_id, c.device_id) == ("t0k", 42, "d1")
        assert await c.block(7) is None
        assert seen[-1].headers["Authorization"] == "Bearer t0k"
        await c.history("s:1:42", begin=5, limit=10)
        assert seen[-1].path == "/v1/conversations/s:1:42/messages"
        assert seen[-1].query == {"begin": "5", "limit": "10", "order": "asc"}
        with pytest.raises(ApiError) as info:
            await c.send_rest("s:1:42", "hello", client_msg_id="abc")
        assert (info.value.status, info.value.code, info.value.message) == (
            403,
            "not_friends",
            "s:1:42",
        )
        sent = orjson.loads(seen[-1].content)
        assert seen[-1].headers["Content-Type"] == "application/json"
        assert sent == {
            "client_msg_id": "abc",
            "conv_id": "s:1:42",
            "content_type": "text",
            "content": {"text": "hello"},
        }
        assert c.ws_url() == f"ws://127.0.0.1:{server.port}/v1/ws?token=t0k"
        await c.aclose()
        assert not http.closed  # a shared pool belongs to the caller
        assert (await http.get(base + "/v1/other")).status_code == 200
