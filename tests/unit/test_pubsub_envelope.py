"""The pub/sub wire: channel names, the envelope around frames and wakes, control
messages; what a node hands on to its callback and what it drops."""

from __future__ import annotations

import logging

import orjson
import pytest

from im_server.storage.redis import keys, pubsub
from im_server.storage.redis.pubsub import BadMessage, Control, Message, SyncWake, UserFrame
from im_server.storage.redis.store import RedisStore


def test_user_frames_round_trip() -> None:
    text = '{"type":"message","message":{"conv_id":"s:1:2","content":{"text":"a\\nb"}}}'
    out = pubsub.user_frames("node-a", [1, 22], text)
    assert [ch for ch, _ in out] == [keys.user_channel(1), keys.user_channel(22)]
    for (ch, data), uid in zip(out, [1, 22], strict=True):
        assert pubsub.decode(ch, data) == ("node-a", UserFrame(uid, text))


def test_a_frame_with_newlines_keeps_them() -> None:
    text = "line one\nline two\n"
    ((ch, data),) = pubsub.user_frames("n", [5], text)
    assert pubsub.decode(ch, data) == ("n", UserFrame(5, text))


def test_sync_wakes_round_trip() -> None:
    out = pubsub.sync_wakes("node-b", (3, 4))
    assert [pubsub.decode(ch, d) for ch, d in out] == [
        ("node-b", SyncWake(3)),
        ("node-b", SyncWake(4)),
    ]


def test_control_round_trip() -> None:
    ch, data = pubsub.control("node-c", "token", "ab01")
    assert ch == keys.CONTROL
    assert pubsub.decode(ch, data) == ("node-c", Control("token", "ab01"))


def test_channel_names() -> None:
    assert keys.user_channel(42) == "im:u:42"
    assert keys.user_of_channel("im:u:42") == 42
    for other in ("im:ctl", "im:u:", "im:u:4x", "im:u:-1", "im:u:١٢", "x:u:4", "im:uu:4"):
        assert keys.user_of_channel(other) is None


@pytest.mark.parametrize(
    ("channel", "data"),
    [
        (keys.CONTROL, "not json"),
        (keys.CONTROL, "[1, 2]"),
        (keys.CONTROL, '{"o": "n", "k": "members"}'),
        (keys.CONTROL, '{"o": 1, "k": "members", "v": "g:1"}'),
        ("im:u:7", "no origin line"),
        ("im:somewhere", "n\nhello"),
        ("im:u:abc", "n\nhello"),
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
    for ch, data in pubsub.user_frames("me", [1], "{}"):
        sub._dispatch(ch, data)
    sub._dispatch(*pubsub.control("me", "node", "me"))
    assert got == []
    with caplog.at_level(logging.WARNING, "im_server.pubsub"):
        sub._dispatch("im:u:1", "garbage without origin")
    assert got == [] and "dropped a pub/sub message" in caplog.text
    for ch, data in pubsub.user_frames("other", [1], "{}"):
        sub._dispatch(ch, data)
    sub._dispatch(*pubsub.control("other", "members", "g:1"))
    assert got == [UserFrame(1, "{}"), Control("members", "g:1")]


def test_a_failing_handler_does_not_stop_the_listener(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Message] = []

    def handler(msg: Message) -> None:
        seen.append(msg)
        raise KeyError("bug")

    sub = pubsub.Subscriber(RedisStore("redis://127.0.0.1:9/0", dedupe_ttl=60), "me", handler)
    with caplog.at_level(logging.ERROR, "im_server.pubsub"):
        sub._dispatch(*pubsub.sync_wakes("other", [2])[0])
        sub._dispatch(*pubsub.sync_wakes("other", [3])[0])
    assert seen == [SyncWake(2), SyncWake(3)]
    assert caplog.text.count("handling a pub/sub message failed") == 2
    assert "KeyError" in caplog.text  # with its traceback


def test_the_control_payload_is_the_documented_json() -> None:
    _, data = pubsub.control("n1", "members", "g:9")
    assert orjson.loads(data) == {"o": "n1", "k": "members", "v": "g:9"}
