"""GET /v1/protocol/ws-schema: a valid JSON Schema (draft 2020-12) that tells good frames
of both directions from bad ones, the same document the models generate, public and
cacheable; and every kind of server frame, produced by a real session, passes it.

(Every frame any integration test receives is checked too: see the autouse fixture
``_validate_server_frames`` in ``tests/conftest.py``.)"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from im_server.client import Connection
from im_server.client.transport import Response, request_sync
from im_server.protocol.schema import ws_schema as generated_schema
from tests.conftest import server_frame_validator
from tests.support import befriend, new_user, persisted

CLIENT_GOOD = [
    {"type": "send", "client_msg_id": "a-1", "conv_id": "s:1:2", "content": {"text": "hi"}},
    {
        "type": "send",
        "client_msg_id": "6f1c2b0e-9a4b",
        "conv_id": "g:7",
        "content_type": "image",
        "content": {"upload_id": "u"},
        "from_a_newer_client": True,  # unknown fields are allowed
    },
    {"type": "read", "conv_id": "s:1:2", "seq": 183},
    {"type": "delivered", "conv_id": "s:1:2", "seq": 0},
    {"type": "typing", "conv_id": "g:7"},
    {"type": "ping"},
    {"type": "edit", "conv_id": "g:7", "seq": 14, "content": {"text": "fixed"}},
]
SERVER_GOOD = [
    {
        "type": "ack",
        "client_msg_id": "a-1",
        "ok": True,
        "conv_id": "s:1:2",
        "seq": 183,
        "server_time": 1764412345678,
        "duplicate": False,
    },
    {
        "type": "ack",
        "client_msg_id": None,
        "ok": False,
        "code": "blocked",
        "message": "the receiver blocked you",
    },
    {
        "type": "message",
        "message": {
            "conv_id": "g:7",
            "seq": 14,
            "sender_id": 2,
            "client_msg_id": "b-9",
            "content_type": "recall",
            "content": None,
            "server_time": 1764412345678,
            "recalled": True,
            "mentions": [3, 4],
            "mention_all": False,
            "reply_to": 12,
            "edited_at": None,
            "reactions": [],
        },
    },
    {
        "type": "message",
        "message": {
            "conv_id": "g:7",
            "seq": 15,
            "sender_id": 2,
            "client_msg_id": "b-10",
            "content_type": "text",
            "content": {"text": "fixed"},
            "server_time": 1764412345678,
            "recalled": False,
            "mentions": [],
            "mention_all": False,
            "reply_to": None,
            "edited_at": 1764412349999,
            "reactions": [{"emoji": "👍", "count": 2, "mine": True}],
        },
    },
    {"type": "edited", "conv_id": "g:7", "seq": 15, "edit_seq": 16, "edited_at": 1764412349999},
    {"type": "edited", "conv_id": "g:7", "seq": 15, "edit_seq": None, "edited_at": None},
    {"type": "read", "conv_id": "s:1:2", "user_id": 1, "seq": 183},
    {"type": "delivered", "conv_id": "s:1:2", "user_id": 1, "seq": 183},
    {"type": "receipt", "conv_id": "g:7", "seq": 14, "read_count": 2},
    {"type": "typing", "conv_id": "g:7", "user_id": 1},
    {"type": "presence", "user_id": 3, "online": True, "last_seen": None},
    {"type": "presence", "user_id": 3, "online": False, "last_seen": 1764412345678},
    {"type": "error", "code": "bad_request", "message": "unknown frame type 'subscribe'"},
    {"type": "pong"},
]
BAD = [
    {"type": "subscribe"},  # no such type
    {"conv_id": "g:1", "seq": 1},  # no type
    {"type": "read", "conv_id": "g:1"},  # a missing field (and not a server read either)
    {"type": "read", "conv_id": "g:1", "seq": True},  # a boolean is not a seq
    {"type": "read", "conv_id": "g:1", "seq": -1},
    {"type": "read", "conv_id": "g:1", "seq": 1.5},
    {"type": "typing", "conv_id": "x:1"},
    {"type": "typing", "conv_id": "g:01"},
    {"type": "send", "client_msg_id": "a b", "conv_id": "s:1:2", "content": {"text": "x"}},
    {"type": "send", "client_msg_id": "a", "conv_id": "s:1:2", "content": "x"},
    {"type": "send", "client_msg_id": "a", "conv_id": "s:1:2", "content_type": "Text"},
    {"type": "ack", "client_msg_id": "a", "ok": True, "conv_id": "s:1:2", "seq": 1},
    {"type": "ack", "client_msg_id": "a", "ok": False, "code": "x"},
    {"type": "receipt", "conv_id": "g:7", "seq": 14, "read_count": 2, "extra": 1},
    {"type": "message", "message": {"conv_id": "g:7", "seq": 14}},
    {"type": "edit", "conv_id": "g:7", "seq": True, "content": {"text": "x"}},
    {"type": "edit", "conv_id": "g:7", "seq": 1, "content": "x"},
    {"type": "edit", "conv_id": "g:7", "content": {"text": "x"}},
    {"type": "edited", "conv_id": "g:7", "seq": 15, "edit_seq": 16},
    {"type": "error", "code": "bad_request"},
    {"type": "presence", "user_id": 3, "online": None, "last_seen": None},  # pushed: a bool
    {"type": "presence", "user_id": 3, "online": True},  # last_seen is always there
    {"type": "presence", "user_id": 0, "online": True, "last_seen": None},
    [],
    "ping",
]


@pytest.fixture
def served(url: str) -> Response:
    r = request_sync("GET", f"{url}/v1/protocol/ws-schema", timeout=30)  # no token
    assert r.status_code == 200, r.text
    return r


def test_served_without_a_token_and_cacheable(served: Response) -> None:
    assert served.headers["content-type"].startswith("application/schema+json")
    assert "max-age" in served.headers["cache-control"]
    assert served.json() == generated_schema()


def test_a_valid_draft_2020_12_schema_of_both_directions(served: Response) -> None:
    schema = served.json()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema_rs.meta.validate(schema)
    assert schema["anyOf"] == [{"$ref": "#/$defs/client_frame"}, {"$ref": "#/$defs/server_frame"}]
    for direction in ("client_frame", "server_frame"):
        members = schema["$defs"][direction]["oneOf"]
        for member in members:
            target = schema["$defs"][member["$ref"].rsplit("/", 1)[1]]
            assert "type" in target["properties"] and "type" in target["required"]


@pytest.mark.parametrize("frame", CLIENT_GOOD + SERVER_GOOD, ids=lambda f: json.dumps(f)[:60])
def test_good_frames_pass(served: Response, frame: Any) -> None:
    validator = jsonschema_rs.Draft202012Validator(served.json())
    assert validator.is_valid(frame), list(validator.iter_errors(frame))


@pytest.mark.parametrize("frame", BAD, ids=lambda f: json.dumps(f)[:60])
def test_bad_frames_fail(served: Response, frame: Any) -> None:
    assert not jsonschema_rs.Draft202012Validator(served.json()).is_valid(frame)


def test_each_direction_on_its_own(served: Response) -> None:
    """``read`` exists in both directions: a server must never send a client's frame
    (server frames are exact). The other way round a server ``read`` is also a valid
    client ``read``, since clients may add fields the server does not know."""
    schema = served.json()
    server_only = server_frame_validator(schema)
    client_only = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/$defs/client_frame", "$defs": schema["$defs"]}
    )
    for frame in CLIENT_GOOD:
        assert client_only.is_valid(frame) and not server_only.is_valid(frame), frame
    for frame in SERVER_GOOD:
        assert server_only.is_valid(frame), frame
    assert not client_only.is_valid(SERVER_GOOD[0])  # an ack is no client frame


async def test_every_kind_of_server_frame_of_a_real_session_passes(url: str) -> None:
    """Drive one session through every server frame type; each frame goes through the
    suite's schema check (the conftest hook) and is also collected here to prove the
    check saw every type."""
    assert Connection.frame_hooks, "the suite's frame check is not installed"
    kinds: set[str] = set()

    def seen(raw: bytes) -> None:
        kinds.add(json.loads(raw).get("type"))

    Connection.frame_hooks.append(seen)
    alice, bob, carol = [await new_user(url, n) for n in ("alice", "bob", "carol")]
    try:
        single = await befriend(alice, bob)
        group = (await alice.create_group("schema", [bob.user_id, carol.user_id]))["conv_id"]
        a, b = await alice.connect(), await bob.connect()
        await a.next_event("presence")  # bob came online
        await a.ping()  # pong
        assert (await a.send(single, "hi"))["ok"] is True  # ack ok, message to bob
        refused = await a.send("s:1:1", "bad")  # refused ack
        assert refused["ok"] is False
        await b.next_event("message")
        await a.send_raw('{"type": "subscribe"}')  # error
        await a.next_event("error")
        await b.typing(single)  # typing
        await a.next_event("typing")
        ack = await a.send(group, "to the group")
        await persisted(alice, group, ack["seq"])  # receipts count persisted messages
        await b.read(single, 1)  # read to alice
        await b.delivered(single, 1)  # delivered to alice
        await a.next_event("read")
        await a.next_event("delivered")
        await b.read(group, ack["seq"])  # a receipt for alice, about a second later
        await a.next_event("receipt", timeout=10)
        assert (await a.edit(group, ack["seq"], "edited"))["type"] == "edited"  # edited
        expected = {"ack", "message", "read", "delivered", "typing", "receipt", "error", "pong"}
        expected |= {"presence", "edited"}
        assert expected <= kinds, expected - kinds
    finally:
        Connection.frame_hooks.remove(seen)
        for c in (alice, bob, carol):
            await c.aclose()


async def test_rest_send_answers_the_same_ack_model(url: str) -> None:
    alice, bob = await new_user(url, "alice"), await new_user(url, "bob")
    try:
        conv = await befriend(alice, bob)
        ack = await alice.send_rest(conv, "over REST")
        validator = server_frame_validator(generated_schema())
        assert validator.is_valid(ack), list(validator.iter_errors(ack))
    finally:
        await alice.aclose()
        await bob.aclose()
