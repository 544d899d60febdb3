"""Who gets which push with which badge (``services/push.py``), as pure functions, and what
a gateway's answer means (``services/push_gateway.py``, against a real HTTP gateway)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from im_server.bench.push_gateway import RecordingGateway
from im_server.protocol.push_gateway import NOTIFY_PATH, NOTIFY_REQUEST, badge_notification
from im_server.services.push import Tail, plan_badges, plan_messages
from im_server.services.push_gateway import Gateway, Outcome, notify_url
from im_server.storage.push import Registration
from im_server.storage.push_outbox import Later, PushMessage, Recipient

CONV = "g:1"
BIG = 2**63 - 1


def msg(seq: int, sender: int = 1, content: str | None = '{"text": "hi"}') -> PushMessage:
    return PushMessage(CONV, seq, sender, "Alice", "text", content, 1000 + seq)


def reg(device: str, key: str | None = None) -> Registration:
    return Registration("app", key or f"key-{device}", "apns", device)


def rcp(seq: int, user: int, cursor: int = 0, muted: bool = False, end: int = BIG) -> Recipient:
    return Recipient(CONV, seq, user, cursor, muted, end)


def later(seq: int, sender: int = 1, mentions: tuple[int, ...] = (), all_: bool = False) -> Later:
    return Later(CONV, seq, sender, mentions, all_)


def test_a_burst_gets_the_badge_right_after_each_message() -> None:
    msgs = [msg(s) for s in (5, 6, 7)]
    tails = {CONV: Tail([later(s) for s in (5, 6, 7)])}
    out = plan_messages(
        msgs, [rcp(s, 2) for s in (5, 6, 7)], {2: [reg("p")]}, {}, {2: 3}, tails, True
    )
    assert [(o.key, o.notification["counts"]["unread"]) for o in out] == [
        ((CONV, 5), 1),
        ((CONV, 6), 2),
        ((CONV, 7), 3),
    ]


def test_later_messages_that_do_not_count_are_not_taken_off() -> None:
    """My own later messages, ones past my closed window, and in a muted conversation
    later messages that do not mention me: the badge now does not count them either."""
    tail = Tail(
        [
            later(5),
            later(6, sender=2),  # mine
            later(7, mentions=(2,)),
            later(8, all_=True),
            later(9),  # past my window (kicked at 8)
        ]
    )
    assert tail.counted(2, False, 5, BIG) == 3  # 7, 8, 9
    assert tail.counted(2, False, 5, 8) == 2  # 7, 8
    assert tail.counted(2, True, 5, BIG) == 2  # only the mentions
    assert tail.counted(3, True, 5, BIG) == 1  # @all only
    assert tail.counted(2, False, 7, BIG) == 2  # after my cursor at 7: 8, 9
    assert tail.counted(2, False, 9, 8) == 0  # an empty range counts nothing


def test_the_badge_never_goes_below_zero() -> None:
    out = plan_messages(
        [msg(5)],
        [rcp(5, 2)],
        {2: [reg("p")]},
        {},
        {2: 0},  # read meanwhile
        {CONV: Tail([later(5), later(6)])},
        True,
    )
    assert out[0].notification["counts"] == {"unread": 0}


def test_connected_devices_and_users_without_registrations_get_nothing() -> None:
    regs = {2: [reg("phone"), reg("tablet")], 3: [reg("web")]}
    connected = {2: {"tablet"}, 3: {"web"}}
    out = plan_messages(
        [msg(5)], [rcp(5, 2), rcp(5, 3), rcp(5, 4)], regs, connected, {2: 1}, {}, True
    )
    assert [(o.user_id, [d["pushkey"] for d in o.notification["devices"]]) for o in out] == [
        (2, ["key-phone"])
    ]


def test_the_notification_has_the_gateway_format_and_privacy_drops_content() -> None:
    [full] = plan_messages([msg(5)], [rcp(5, 2)], {2: [reg("p")]}, {}, {2: 1}, {}, True)
    assert full.notification == {
        "event_id": "g:1/5",
        "room_id": "g:1",
        "type": "message",
        "sender": "1",
        "sender_display_name": "Alice",
        "content": {"text": "hi"},
        "counts": {"unread": 1},
        "prio": "high",
        "devices": [{"app_id": "app", "pushkey": "key-p", "data": {}}],
    }
    NOTIFY_REQUEST.validate_python({"notification": full.notification})
    [bare] = plan_messages([msg(5)], [rcp(5, 2)], {2: [reg("p")]}, {}, {2: 1}, {}, False)
    assert "content" not in bare.notification
    assert "sender_display_name" not in bare.notification
    assert bare.notification["event_id"] == "g:1/5"


def test_recipients_of_messages_not_in_the_round_are_ignored() -> None:
    """A recalled message is left out of ``msgs``: its recipients get nothing."""
    assert plan_messages([], [rcp(5, 2)], {2: [reg("p")]}, {}, {2: 1}, {}, True) == []


def test_badge_only_pushes_go_to_unconnected_devices_with_low_priority() -> None:
    out = plan_badges(
        [2, 3], {2: [reg("p"), reg("w")], 3: [reg("x")]}, {2: {"w"}, 3: {"x"}}, {2: 4}
    )
    assert [o.user_id for o in out] == [2]
    assert out[0].key is None
    assert out[0].notification == badge_notification(
        4, [{"app_id": "app", "pushkey": "key-p", "data": {}}]
    )
    assert out[0].notification["prio"] == "low"


def test_tail_counts_match_a_plain_count() -> None:
    """The bisections against the rule written out, on random tails."""
    rnd = random.Random(7)
    for _ in range(200):
        msgs = [
            later(
                s,
                sender=rnd.choice([1, 2, 3]),
                mentions=tuple(rnd.sample([2, 3], rnd.randint(0, 2))),
                all_=rnd.random() < 0.1,
            )
            for s in sorted(rnd.sample(range(1, 60), rnd.randint(0, 30)))
        ]
        tail = Tail(msgs)
        user, muted = rnd.choice([2, 3]), rnd.random() < 0.5
        lo, hi = rnd.randint(0, 60), rnd.choice([BIG, rnd.randint(0, 60)])
        want = sum(
            1
            for t in msgs
            if lo < t.seq <= hi
            and t.sender_id != user
            and (not muted or t.mention_all or user in t.mentions)
        )
        assert tail.counted(user, muted, lo, hi) == want


def test_notify_url_adds_the_api_path_only_when_none_is_given() -> None:
    assert notify_url("http://gw:5000") == "http://gw:5000" + NOTIFY_PATH
    assert notify_url("http://gw:5000/") == "http://gw:5000" + NOTIFY_PATH
    assert notify_url("https://gw/custom/notify") == "https://gw/custom/notify"


@pytest.fixture
def gw() -> Iterator[RecordingGateway]:
    g = RecordingGateway().start()
    yield g
    g.stop()


async def test_gateway_answers_sent_rejected_retry_and_dropped(gw: RecordingGateway) -> None:
    client = Gateway(gw.url, timeout=5, concurrency=2)
    try:
        n = badge_notification(1, [{"app_id": "a", "pushkey": "k1", "data": {}}])
        a = await client.notify(n)
        assert (a.outcome, a.rejected) == (Outcome.SENT, [])
        gw.rejected.add("k1")
        a = await client.notify(n)
        assert (a.outcome, a.rejected) == (Outcome.SENT, ["k1"])
        for status, outcome in ((500, Outcome.RETRY), (429, Outcome.RETRY), (400, Outcome.DROPPED)):
            gw.fail_status = status
            assert (await client.notify(n)).outcome is outcome
        gw.fail_status = None
        gw.stop()
        assert (await client.notify(n)).outcome is Outcome.RETRY  # connection refused
    finally:
        await client.close()


async def test_an_unreadable_gateway_answer_rejects_nothing(gw: RecordingGateway) -> None:
    """A 200 means delivered; an answer that is not the API's shape deletes no key."""
    client = Gateway(gw.url, timeout=5, concurrency=2)
    try:
        n = badge_notification(1, [{"app_id": "a", "pushkey": "k1", "data": {}}])
        for body in (b"not json", b"[]", b'{"rejected": "k1"}', b'{"rejected": [1, {}]}', b"{}"):
            gw.answer = body
            a = await client.notify(n)
            assert (a.outcome, a.rejected) == (Outcome.SENT, []), body
        gw.answer = b'{"rejected": ["k1"], "extra": true}'
        assert (await client.notify(n)).rejected == ["k1"]
    finally:
        await client.close()
