"""The pub/sub wire: inbox channels, the routing of frames and wakes to the nodes the
registry lists (one message per node and publish round, its records batched, never back
to the origin), the envelope, control messages; what a node hands on to its callback
and what it drops."""

from __future__ import annotations

import logging

import orjson
import pytest

from im_server.storage.redis import keys, pubsub
from im_server.storage.redis.pubsub import BadMessage, Control, Message, SyncWake, UserFrame
from im_server.storage.redis.store import RedisStore

WHERE = {1: ["a", "b"], 2: ["b"], 3: ["a"], 4: [], 5: ["c", "b"]}


def test_one_message_per_node_with_its_users() -> None:
    text = '{"type":"message","message":{"conv_id":"g:1","content":{"text":"a\\nb"}}}'
    out = pubsub.route("a", [((1, 2, 3, 4, 5), text)], WHERE)
    decoded = {ch: pubsub.decode(ch, data) for ch, data in out}
    assert decoded == {
        keys.inbox("b"): ("a", [UserFrame((1, 2, 5), text)]),
        keys.inbox("c"): ("a", [UserFrame((5,), text)]),
    }  # never to the origin "a"; user 4 is held nowhere
    # one record: the form every release reads
    assert sorted(out)[0][1] == f"a\n1,2,5\n{text}"


def test_the_frames_of_a_round_are_one_message_per_node_in_order() -> None:
    out = pubsub.route("x", [((3,), "one"), ((2, 3), "two"), ((4,), "three")], WHERE)
    assert sorted(out) == sorted(
        [
            (keys.inbox("a"), "x\n*\n3\none\n3\ntwo"),
            (keys.inbox("b"), "x\n2\ntwo"),
        ]
    )
    assert [pubsub.decode(ch, d) for ch, d in sorted(out)] == [
        ("x", [UserFrame((3,), "one"), UserFrame((3,), "two")]),
        ("x", [UserFrame((2,), "two")]),
    ]


def test_a_big_round_is_cut_into_messages_of_bounded_size() -> None:
    n = 2 * pubsub.RECORDS_PER_MESSAGE + 1
    out = pubsub.route("x", [((7,), f"f{i}") for i in range(n)], {7: ["a"]})
    assert len(out) == 3
    frames = [m for ch, d in out for m in pubsub.decode(ch, d)[1]]
    assert frames == [UserFrame((7,), f"f{i}") for i in range(n)]


def test_a_frame_with_newlines_keeps_them_and_travels_alone() -> None:
    text = "line one\nline two\n"
    out = pubsub.route("n", [((5,), "before"), ((5,), text), ((5,), "after")], {5: ["m"]})
    assert (keys.inbox("m"), f"n\n5\n{text}") in out
    frames = [m for ch, d in out for m in pubsub.decode(ch, d)[1]]
    assert sorted(f.text for f in frames if isinstance(f, UserFrame)) == sorted(
        ["before", text, "after"]
    )


def test_sync_wakes_round_trip() -> None:
    out = pubsub.route("node-b", [((3, 4), pubsub.SYNC_WAKE)], {3: ["q"], 4: ["q"]})
    assert [pubsub.decode(ch, d) for ch, d in out] == [("node-b", [SyncWake((3, 4))])]
    out = pubsub.route("node-b", [((3,), pubsub.SYNC_WAKE), ((3,), "{}")], {3: ["q"]})
    assert [pubsub.decode(ch, d) for ch, d in out] == [
        ("node-b", [SyncWake((3,)), UserFrame((3,), "{}")])
    ]


def test_control_round_trip() -> None:
    ch, data = pubsub.control("node-c", "token", "ab01")
    assert ch == keys.CONTROL
    assert pubsub.decode(ch, data) == ("node-c", [Control("token", "ab01")])


@pytest.mark.parametrize(
    ("channel", "data"),
    [
        (keys.CONTROL, "not json"),
        (keys.CONTROL, "[1, 2]"),
        (keys.CONTROL, '{"o": "n", "k": "members"}'),
        (keys.CONTROL, '{"o": 1, "k": "members", "v": "g:1"}'),
        ("im:in:me", "no origin line"),
        ("im:in:me", "n\nno users line"),
        ("im:in:me", "n\n\nempty users"),
        ("im:in:me", "n\n1,,2\nx"),
        ("im:in:me", "n\n-1\nx"),
        ("im:in:me", "n\n١٢\nx"),
        ("im:in:me", "n\n" + "9" * 20 + "\nx"),
        ("im:in:me", "n\n*\n1\nx\n2"),  # batched: an odd number of lines
        ("im:in:me", "n\n*\n1\nx\nbad\ny"),
        ("im:somewhere", "n\n1\nhello"),
        ("im:u:7", "n\n1\nhello"),
    ],
)
def test_malformed_messages_are_refused(channel: str, data: str) -> None:
    with pytest.raises(BadMessage):
        pubsub.decode(channel, data)


def _subscriber(got: list[Message]) -> pubsub.Subscriber:
    # the client connects lazily: nothing here talks to Redis
    redis = RedisStore("redis://127.0.0.1:9/0", dedupe_ttl=60)
    return pubsub.Subscriber(redis, "me", got.append)


def test_a_node_drops_its_own_messages_and_bad_ones(caplog: pytest.LogCaptureFixture) -> None:
    got: list[Message] = []
    sub = _subscriber(got)
    assert sub.inbox == keys.inbox("me")
    sub._dispatch(sub.inbox, "me\n1\n{}")
    sub._dispatch(*pubsub.control("me", "node", "me"))
    assert got == []
    with caplog.at_level(logging.WARNING, "im_server.pubsub"):
        sub._dispatch(sub.inbox, "garbage without origin")
    assert got == [] and "dropped a pub/sub message" in caplog.text
    ((ch, data),) = pubsub.route("other", [((1,), "{}")], {1: ["me"]})
    sub._dispatch(ch, data)
    sub._dispatch(*pubsub.control("other", "members", "g:1"))
    assert got == [UserFrame((1,), "{}"), Control("members", "g:1")]


def test_a_failing_handler_does_not_stop_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Message] = []

    def handler(msg: Message) -> None:
        seen.append(msg)
        raise KeyError("bug")

    sub = pubsub.Subscriber(RedisStore("redis://127.0.0.1:9/0", dedupe_ttl=60), "me", handler)
    with caplog.at_level(logging.ERROR, "im_server.pubsub"):
        for uid in (2, 3):
            ((ch, data),) = pubsub.route("other", [((uid,), pubsub.SYNC_WAKE)], {uid: ["me"]})
            sub._dispatch(ch, data)
    assert seen == [SyncWake((2,)), SyncWake((3,))]
    assert caplog.text.count("handling a pub/sub message failed") == 2
    assert "KeyError" in caplog.text  # with its traceback


def test_the_control_payload_is_the_documented_json() -> None:
    _, data = pubsub.control("n1", "members", "g:9")
    assert orjson.loads(data) == {"o": "n1", "k": "members", "v": "g:9"}
