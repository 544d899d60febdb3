"""The named wire types: strict integers, the 64-bit bounds, the cursor clamp, string
shapes, and the one sentence each type answers a bad value with (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from im_server.protocol.ids import parse_conv_id
from im_server.protocol.types import (
    MAX_INT64,
    ClientContentType,
    ClientMsgId,
    ContentType,
    ConvId,
    JsonObject,
    ReportedSeq,
    Seq,
    UserId,
    conv_ref,
)

USER_ID: TypeAdapter[int] = TypeAdapter(UserId)
SEQ: TypeAdapter[int] = TypeAdapter(Seq)
REPORTED: TypeAdapter[int] = TypeAdapter(ReportedSeq)
CONV: TypeAdapter[str] = TypeAdapter(ConvId)
CMID: TypeAdapter[str] = TypeAdapter(ClientMsgId)
CTYPE: TypeAdapter[str] = TypeAdapter(ContentType)
CLIENT_CTYPE: TypeAdapter[str] = TypeAdapter(ClientContentType)
OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(JsonObject)


def refusal(adapter: TypeAdapter[Any], value: object) -> str:
    with pytest.raises(ValidationError) as exc:
        adapter.validate_python(value)
    errors = exc.value.errors()
    assert len(errors) == 1, errors
    assert errors[0]["type"] == "bad_value", errors
    return str(errors[0]["msg"])


@pytest.mark.parametrize("value", [1, 2, 10**18, MAX_INT64])
def test_user_id_accepts_positive_64_bit(value: int) -> None:
    assert USER_ID.validate_python(value) == value
    assert USER_ID.validate_json(str(value)) == value


@pytest.mark.parametrize(
    "value", [0, -1, MAX_INT64 + 1, 2**64, True, False, 1.0, 2.5, "1", None, [1], b"1"]
)
def test_user_id_refuses(value: object) -> None:
    assert refusal(USER_ID, value) == "must be a positive 64-bit integer"


def test_json_booleans_and_floats_are_not_integers_in_json_either() -> None:
    for text in ("true", "1.0", "1e3", '"5"'):
        with pytest.raises(ValidationError):
            SEQ.validate_json(text)


@pytest.mark.parametrize("value", [0, 1, MAX_INT64])
def test_seq_bounds(value: int) -> None:
    assert SEQ.validate_python(value) == value


@pytest.mark.parametrize("value", [-1, MAX_INT64 + 1, True, 0.0])
def test_seq_refuses(value: object) -> None:
    assert refusal(SEQ, value) == "must be a non-negative 64-bit integer"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 0), (5, 5), (MAX_INT64, MAX_INT64), (MAX_INT64 + 1, MAX_INT64), (2**64 - 1, MAX_INT64)],
)
def test_reported_seq_is_clamped_not_refused(value: int, expected: int) -> None:
    assert REPORTED.validate_python(value) == expected


@pytest.mark.parametrize("value", [-1, True, 1.5, "3", None])
def test_reported_seq_refuses(value: object) -> None:
    assert refusal(REPORTED, value) == "must be a non-negative integer"


@pytest.mark.parametrize(
    "conv_id", ["s:1:2", "s:7:1000", f"s:1:{MAX_INT64}", "g:5", f"g:{MAX_INT64}"]
)
def test_conv_id_accepts(conv_id: str) -> None:
    assert CONV.validate_python(conv_id) == conv_id
    assert conv_ref(conv_id) == parse_conv_id(conv_id)


@pytest.mark.parametrize(
    "conv_id",
    ["s:2:1", "s:1:1", "g:0", "g:05", f"g:{MAX_INT64 + 1}", "g:1\n", "g:\u0661", "x:1", "", 5],
)
def test_conv_id_refuses_like_ids(conv_id: object) -> None:
    """The model type and ``ids.parse_conv_id`` apply the same rule (one rule, two entry
    points): what one refuses the other refuses, with the same sentence."""
    message = refusal(CONV, conv_id)
    assert message == "must be 's:<a>:<b>' with a < b or 'g:<group_id>'"
    with pytest.raises(Exception) as exc:
        parse_conv_id(conv_id)
    assert str(exc.value) == f"conv_id {message}"


def test_conv_ref_parts() -> None:
    single = conv_ref("s:3:9")
    assert (single.kind, single.a, single.b) == ("single", 3, 9)
    assert single.peer_of(3) == 9 and single.has_user(9) and not single.has_user(4)
    group = conv_ref("g:42")
    assert (group.kind, group.group_id) == ("group", 42)


@pytest.mark.parametrize("value", ["a", "x" * 64, "6f1c2b0e-9a4b_X"])
def test_client_msg_id_accepts(value: str) -> None:
    assert CMID.validate_python(value) == value


@pytest.mark.parametrize("value", ["", "x" * 65, "a b", "a\n", "é", 5, None, b"abc"])
def test_client_msg_id_refuses(value: object) -> None:
    assert refusal(CMID, value) == "must be 1-64 characters of [A-Za-z0-9_-]"


@pytest.mark.parametrize("value", ["text", "image", "a.b-c_1", "x" * 32])
def test_content_type_accepts(value: str) -> None:
    assert CLIENT_CTYPE.validate_python(value) == value


@pytest.mark.parametrize("value", ["", "Text", "1abc", "x" * 33, "a b", 5, None])
def test_content_type_refuses(value: object) -> None:
    assert refusal(CTYPE, value).startswith("must be a lowercase word")


@pytest.mark.parametrize("value", ["system", "recall"])
def test_server_content_types_are_the_servers(value: str) -> None:
    assert CTYPE.validate_python(value) == value  # in messages the server sends
    assert "are the server's" in refusal(CLIENT_CTYPE, value)  # never from a client


@pytest.mark.parametrize("value", [{}, {"text": "hi"}, {"a": [1, {"b": None}]}])
def test_json_object_accepts(value: dict[str, Any]) -> None:
    assert OBJECT.validate_python(value) is value  # not copied: checked at the top only


@pytest.mark.parametrize("value", [[], "x", 1, None, True])
def test_json_object_refuses(value: object) -> None:
    assert refusal(OBJECT, value) == "must be a JSON object"


def test_rules_are_the_json_schema_descriptions() -> None:
    schema = USER_ID.json_schema()
    assert schema["description"] == "must be a positive 64-bit integer"
    assert (schema["minimum"], schema["maximum"]) == (1, MAX_INT64)
    assert CONV.json_schema()["maxLength"] == 45
