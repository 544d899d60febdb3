"""``decode`` of the persister: a stream entry as ``send_batch.lua`` queues it (``q`` the
seq, ``d`` the send's fields joined by NUL, as ``RedisStore.send_many`` builds them) becomes
a ``NewMessage``; anything else raises ``MalformedEntry`` (the persister logs and drops it)."""

from __future__ import annotations

import orjson
import pytest

from im_server.storage.messages import NewMessage
from im_server.workers.persister import MalformedEntry, decode

CONTENT = orjson.dumps({"text": "hi\tthere \u00e9 \\0 not a NUL"}).decode()


def d(*fields: object) -> str:
    return "\0".join(str(f) for f in fields)


GOOD = d("s:1:2", 1, "cmid-1", "text", CONTENT, 1_700_000_000_123, "0", "1")
EXPECTED = NewMessage("s:1:2", 42, 1, "cmid-1", "text", CONTENT, 1_700_000_000_123)


def test_mapping_entry() -> None:
    assert decode({"q": "42", "d": GOOD}) == EXPECTED


def test_raw_list_entry_in_either_order() -> None:
    assert decode(["q", "42", "d", GOOD]) == EXPECTED
    assert decode(["d", GOOD, "q", "42"]) == EXPECTED


def test_trailing_flags_are_optional_and_content_keeps_its_text() -> None:
    assert decode(
        {"q": "42", "d": d("s:1:2", 1, "cmid-1", "text", CONTENT, 1_700_000_000_123)}
    ) == (EXPECTED)
    group = decode({"q": "7", "d": d("g:9", 3, "x", "recall", '{"seq":5}', 5, "1", "1")})
    assert group == NewMessage("g:9", 7, 3, "x", "recall", '{"seq":5}', 5)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        pytest.param({"d": GOOD}, "no q", id="no-seq"),
        pytest.param({"q": "42"}, "no q", id="no-data"),
        pytest.param({}, "no q", id="empty"),
        pytest.param([], "no q", id="empty-list"),
        pytest.param(["q", "42", "d"], "not pairs", id="odd-list"),
        pytest.param({"q": "x", "d": GOOD}, "not an integer", id="seq-not-int"),
        pytest.param({"q": "", "d": GOOD}, "not an integer", id="seq-empty"),
        pytest.param(
            {"q": "1", "d": d("s:1:2", "me", "m", "text", CONTENT, 5)},
            "not an integer",
            id="sender-not-int",
        ),
        pytest.param(
            {"q": "1", "d": d("s:1:2", 1, "m", "text", CONTENT, "later")},
            "not an integer",
            id="time-not-int",
        ),
        pytest.param({"q": "1", "d": d("s:1:2", 1, "m", "text")}, "4 of 6", id="short-d"),
        pytest.param({"q": "1", "d": ""}, "1 of 6", id="empty-d"),
        # the retired one-field-per-value form is no entry of ours any more
        pytest.param(
            {"c": "s:1:2", "q": "1", "s": "1", "m": "m", "t": "text", "b": CONTENT, "ts": "5"},
            "no q",
            id="legacy-fields",
        ),
        pytest.param(None, "not a list or a mapping", id="deleted-entry"),
    ],
)
def test_malformed_entries_are_refused_with_a_reason(fields: object, why: str) -> None:
    with pytest.raises(MalformedEntry, match=why):
        decode(fields)  # type: ignore[arg-type]


def test_malformed_entry_is_a_value_error() -> None:
    """Callers that catch ValueError (the persister did) still catch it."""
    with pytest.raises(ValueError):
        decode({"q": "1"})


def test_mentions_mention_all_and_reply_to_round_trip_through_the_entry() -> None:
    """What ``RedisStore`` appends for a send that mentions or replies is what decode
    reads back; a plain send's entry has none of it."""
    from im_server.storage.redis.store import SendArgs, encode_extras

    args = SendArgs("g:9", 3, "m", "text", CONTENT, 5, 0)
    assert encode_extras(args) == ""
    for mentions, mention_all, reply_to in (([4, 2**63 - 1], False, None), ([], True, 3)):
        args.mentions, args.mention_all, args.reply_to = mentions, mention_all, reply_to
        entry = d("g:9", 3, "m", "text", CONTENT, 5, "0", "0") + encode_extras(args)
        got = decode({"q": "8", "d": entry})
        assert (got.mentions, got.mention_all, got.reply_to) == (mentions, mention_all, reply_to)
        assert got.content_json == CONTENT and got.seq == 8
    with pytest.raises(MalformedEntry, match="not an integer"):
        decode({"q": "8", "d": d("g:9", 3, "m", "text", CONTENT, 5, "0", "0", "x,1", "0", "")})
