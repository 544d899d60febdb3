"""Client frame parsing and server frame building (pure): what is refused and with which
sentence, forward compatibility, and that every builder's output is an exact instance
of its model (the spliced ``message`` frame included)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from im_server.errors import STATUS, ImError
from im_server.protocol.client_frames import (
    DeliveredFrame,
    FrameError,
    PingFrame,
    ReadFrame,
    SendFrame,
    TypingFrame,
    parse_client_frame,
)
from im_server.protocol.close_codes import CloseCode
from im_server.protocol.server_frames import (
    PONG,
    SERVER_FRAME,
    ack,
    cursor_push,
    edited,
    encode,
    error_frame,
    message_frame,
    message_push,
    presence_push,
    receipt_push,
    refused_ack,
    typing_push,
)

SEND = {
    "type": "send",
    "conv_id": "s:1:2",
    "client_msg_id": "a-1",
    "content_type": "text",
    "content": {"text": "hello"},
}


def refused(frame: object) -> FrameError:
    data = frame if isinstance(frame, (str, bytes)) else json.dumps(frame)
    with pytest.raises(FrameError) as exc:
        parse_client_frame(data)
    assert exc.value.code == "bad_request" and exc.value.status == 400
    assert exc.value.message
    return exc.value


# -- the envelope ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{",
        "",
        "[]",
        '[{"type": "ping"}]',
        "null",
        "1",
        '"ping"',
        '{"type": "ping", "x": NaN}',  # not RFC 8259
        '{"type": "ping", "x": "\\ud800"}',  # a lone surrogate
        b"\xff\xfe",
    ],
)
def test_not_one_json_object(text: str | bytes) -> None:
    assert refused(text).message == "a frame must be one JSON object"


@pytest.mark.parametrize("text", ["{}", '{"conv_id": "g:1"}', '{"type": null}', '{"type": 5}'])
def test_no_string_type(text: str) -> None:
    assert refused(text).message == "a frame needs a string 'type'"


@pytest.mark.parametrize("ftype", ["nope", "PING", "ack", "message", "error", "x" * 100])
def test_unknown_type(ftype: str) -> None:
    err = refused({"type": ftype})
    assert err.message == f"unknown frame type {ftype[:32]!r}"
    assert err.frame_type is None


# -- each client frame ----------------------------------------------------------------------


def test_each_client_frame() -> None:
    send = parse_client_frame(json.dumps(SEND))
    assert isinstance(send, SendFrame)
    assert (send.conv_id, send.client_msg_id, send.content_type) == ("s:1:2", "a-1", "text")
    assert send.content == {"text": "hello"}
    read = parse_client_frame(b'{"type": "read", "conv_id": "g:7", "seq": 3}')
    assert isinstance(read, ReadFrame) and read.seq == 3
    delivered = parse_client_frame('{"type": "delivered", "conv_id": "g:7", "seq": 0}')
    assert isinstance(delivered, DeliveredFrame) and delivered.seq == 0
    typing = parse_client_frame('{"type": "typing", "conv_id": "s:1:2"}')
    assert isinstance(typing, TypingFrame) and typing.conv_id == "s:1:2"
    assert isinstance(parse_client_frame('{"type": "ping"}'), PingFrame)


def test_content_type_defaults_to_text() -> None:
    frame = parse_client_frame(json.dumps({k: v for k, v in SEND.items() if k != "content_type"}))
    assert isinstance(frame, SendFrame) and frame.content_type == "text"


def test_unknown_fields_are_ignored() -> None:
    """Forward compatibility: a newer client's optional fields do not make a frame bad."""
    frame = parse_client_frame(json.dumps({**SEND, "quote_of": 4, "z": None}))
    assert isinstance(frame, SendFrame)
    assert not hasattr(frame, "quote_of")
    assert isinstance(parse_client_frame('{"type": "ping", "id": 7}'), PingFrame)


def test_a_reported_seq_above_64_bits_is_clamped() -> None:
    frame = parse_client_frame(json.dumps({"type": "read", "conv_id": "g:1", "seq": 2**64 - 1}))
    assert isinstance(frame, ReadFrame) and frame.seq == 2**63 - 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"conv_id": "s:2:1"}, "conv_id must be 's:<a>:<b>' with a < b or 'g:<group_id>'"),
        ({"conv_id": None}, "conv_id must be 's:<a>:<b>' with a < b or 'g:<group_id>'"),
        ({"client_msg_id": "a b"}, "client_msg_id must be 1-64 characters of [A-Za-z0-9_-]"),
        ({"client_msg_id": 5}, "client_msg_id must be 1-64 characters of [A-Za-z0-9_-]"),
        ({"content_type": "system"}, "content_type must be a lowercase word like 'text' ("),
        ({"content_type": 7}, "content_type must be a lowercase word like 'text' ("),
        ({"content": [1]}, "content must be a JSON object"),
        ({"content": {"text": ""}}, "a text message needs content.text, a non-empty string"),
        ({"content": {"text": 5}}, "a text message needs content.text, a non-empty string"),
        ({"content": {}}, "a text message needs content.text, a non-empty string"),
    ],
)
def test_bad_send_fields(change: dict[str, Any], message: str) -> None:
    err = refused({**SEND, **change})
    assert err.message.startswith(message), err.message
    assert err.frame_type == "send"
    assert err.client_msg_id == change.get("client_msg_id", "a-1")  # as sent, for the ack


def test_any_content_type_other_than_text_and_attachments_takes_any_object() -> None:
    frame = parse_client_frame(json.dumps({**SEND, "content_type": "sticker", "content": {}}))
    assert isinstance(frame, SendFrame) and frame.content == {}


def test_a_picture_or_file_names_an_upload() -> None:
    for ctype in ("image", "file"):
        with pytest.raises(FrameError, match="upload_id"):
            parse_client_frame(json.dumps({**SEND, "content_type": ctype, "content": {}}))
    ok = {**SEND, "content_type": "file", "content": {"upload_id": "A" * 22, "caption": "c"}}
    assert isinstance(parse_client_frame(json.dumps(ok)), SendFrame)


def test_the_first_bad_field_in_contract_order_is_named() -> None:
    """conv_id, then client_msg_id, then content_type, then content."""
    bad = {"type": "send", "conv_id": "x", "client_msg_id": "", "content": 1}
    assert refused(bad).message.startswith("conv_id ")
    assert refused({**bad, "conv_id": "g:1"}).message.startswith("client_msg_id ")


def test_a_missing_field_is_named_with_its_rule() -> None:
    err = refused({"type": "read", "conv_id": "g:1"})
    assert err.message == "seq is required and must be a non-negative integer"
    assert refused({"type": "typing"}).message.startswith("conv_id is required and must be")
    assert refused({k: v for k, v in SEND.items() if k != "content"}).message == (
        "content is required and must be a JSON object"
    )


@pytest.mark.parametrize("seq", [True, False, 1.0, 1.5, -1, "1", None, [1]])
@pytest.mark.parametrize("ftype", ["read", "delivered"])
def test_bad_seq(ftype: str, seq: object) -> None:
    err = refused({"type": ftype, "conv_id": "g:1", "seq": seq})
    assert err.message == "seq must be a non-negative integer"
    assert err.frame_type == ftype


# -- server frames --------------------------------------------------------------------------

ERR = ImError("not_friends", "you are not friends")


def server_frames() -> list[Any]:
    return [
        ack("s:1:2", "a-1", 5, 1764412345678, False),
        ack("g:7", "x" * 64, 2**63 - 1, 0, True),
        refused_ack("a-1", ERR),
        refused_ack(None, ERR),
        refused_ack(12, ERR),
        refused_ack("y" * 129, ERR),
        message_push("g:7", 14, 2, "b-9", "text", {"text": "hi all"}, 1764412345678),
        cursor_push("read", "s:1:2", 1, 183),
        cursor_push("delivered", "s:1:2", 1, 0),
        receipt_push("g:7", 14, 2),
        typing_push("g:7", 1),
        presence_push(3, True, None),
        presence_push(3, False, 1764412345678),
        error_frame(ImError("bad_request", "unknown frame type 'subscribe'")),
        edited("g:7", 14, 15, 1764412345678),
        edited("g:7", 14, None, None),
    ]


@pytest.mark.parametrize("frame", server_frames())
def test_every_builder_makes_an_exact_model_instance(frame: Any) -> None:
    text = encode(frame)
    assert SERVER_FRAME.validate_json(text) == frame
    assert json.loads(text) == frame


def test_server_models_forbid_extra_fields_and_check_values() -> None:
    frame = dict(ack("s:1:2", "a-1", 5, 1, False))
    with pytest.raises(ValidationError):
        SERVER_FRAME.validate_python({**frame, "extra": 1})
    with pytest.raises(ValidationError):
        SERVER_FRAME.validate_python({**frame, "seq": True})
    with pytest.raises(ValidationError):
        SERVER_FRAME.validate_python({**frame, "ok": False})  # a refused ack has no seq


def test_refused_ack_echoes_only_short_string_ids() -> None:
    assert refused_ack("a-1", ERR)["client_msg_id"] == "a-1"
    assert refused_ack("z" * 128, ERR)["client_msg_id"] == "z" * 128
    for cmid in ("z" * 129, 5, None, ["a"], {"a": 1}):
        assert refused_ack(cmid, ERR)["client_msg_id"] is None
    assert refused_ack("a", ERR) == {
        "type": "ack",
        "client_msg_id": "a",
        "ok": False,
        "code": "not_friends",
        "message": "you are not friends",
    }


def test_pong() -> None:
    assert json.loads(PONG) == {"type": "pong"}
    assert SERVER_FRAME.validate_json(PONG) == {"type": "pong"}


CONTENTS = [
    {"text": "hello"},
    {"text": '你好，世界 👋🏽 \u202e ünïcödé "quoted" \\ back\nline\ttab'},
    {"text": "x", "nested": {"list": [1, 2.5, -3, True, None, {"deep": ["a", {"b": []}]}]}},
    {"upload_id": "u1", "caption": "", "width": 640, "height": 480, "big": 2**63 - 1},
    {},
    {"\u0000key": "nul is JSON, refused later by the send pipeline"},
]


@pytest.mark.parametrize("content", CONTENTS)
def test_spliced_message_frame_equals_the_models_json(content: dict[str, Any]) -> None:
    """``message_frame`` splices the send pipeline's encoding of the content instead of
    encoding the frame; the result is byte for byte the model's JSON."""
    content_json = orjson.dumps(content).decode()  # what check_send hands on
    args = ("s:1:2", 7, 1, "a-7", "text", 1764412345678)
    spliced = message_frame(*args[:5], content_json, args[5])
    model = message_push(*args[:5], content, args[5])
    assert spliced == encode(model)
    assert SERVER_FRAME.validate_json(spliced) == model
    assert SERVER_FRAME.dump_json(model).decode() == spliced
    # a new message is pushed never edited and without reactions
    assert model["message"]["edited_at"] is None and model["message"]["reactions"] == []
    assert spliced.endswith(',"reply_to":null,"edited_at":null,"reactions":[]}}')


EXTRAS: list[dict[str, Any]] = [
    {},
    {"mentions": [3, 2**63 - 1, 1]},
    {"mention_all": True},
    {"reply_to": 41},
    {"mentions": [5], "mention_all": True, "reply_to": 2**63 - 1},
]


@pytest.mark.parametrize("extras", EXTRAS)
@pytest.mark.parametrize("content", CONTENTS[:3])
def test_spliced_message_frame_with_mentions_and_reply(
    content: dict[str, Any], extras: dict[str, Any]
) -> None:
    """Mentions, mention_all and reply_to are spliced too, in the model's key order."""
    content_json = orjson.dumps(content).decode()
    args = ("g:9", 8, 2, "b-8", "text", 1764412345679)
    spliced = message_frame(*args[:5], content_json, args[5], **extras)
    model = message_push(*args[:5], content, args[5], **extras)
    assert spliced == encode(model)
    assert SERVER_FRAME.validate_json(spliced) == model
    msg = orjson.loads(spliced)["message"]
    assert msg["mentions"] == extras.get("mentions", [])
    assert msg["mention_all"] is extras.get("mention_all", False)
    assert msg["reply_to"] == extras.get("reply_to")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"mentions": 5}, "mentions"),
        ({"mentions": [0]}, "mentions"),
        ({"mentions": [-1]}, "mentions"),
        ({"mentions": [True]}, "mentions"),
        ({"mentions": ["2"]}, "mentions"),
        ({"mentions": [1.0]}, "mentions"),
        ({"mentions": [2**63]}, "mentions"),
        ({"mentions": list(range(1, 102))}, "mentions"),
        ({"mentions": [7] * 101}, "mentions"),
        ({"mention_all": 1}, "mention_all"),
        ({"mention_all": "true"}, "mention_all"),
        ({"reply_to": 0}, "reply_to"),
        ({"reply_to": -3}, "reply_to"),
        ({"reply_to": True}, "reply_to"),
        ({"reply_to": "4"}, "reply_to"),
        ({"reply_to": 2**63}, "reply_to"),
    ],
)
def test_bad_mentions_and_reply_are_refused_naming_the_field(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(FrameError) as e:
        parse_client_frame(json.dumps({**SEND, **extra}))
    assert e.value.frame_type == "send"
    assert str(e.value).startswith(field), str(e.value)


def test_mentions_and_reply_are_optional_and_parsed() -> None:
    plain = parse_client_frame(json.dumps(SEND))
    assert isinstance(plain, SendFrame) and plain.plain
    assert (plain.mentions, plain.mention_all, plain.reply_to) == ([], False, None)
    full = parse_client_frame(
        json.dumps({**SEND, "mentions": [2, 2, 3], "mention_all": True, "reply_to": 1})
    )
    assert isinstance(full, SendFrame) and not full.plain
    assert (full.mentions, full.mention_all, full.reply_to) == ([2, 2, 3], True, 1)
    assert parse_client_frame(json.dumps({**SEND, "mentions": list(range(1, 101))}))


def test_close_codes() -> None:
    assert {c.name: int(c) for c in CloseCode} == {
        "TOO_MANY_CONNECTIONS": 1008,
        "TOO_BIG": 1009,
        "INTERNAL_ERROR": 1011,
        "RESTART": 1012,
        "TRY_AGAIN": 1013,
        "UNAUTHORIZED": 4401,
    }


def test_error_codes_of_frames_are_the_contracts() -> None:
    for code in STATUS:
        assert SERVER_FRAME.validate_python(error_frame(ImError(code)))["code"] == code
