"""The integer rule of requests and frames (``protocol/json_ints.py``): every whole number
fits in 64 bits (-2^63 .. 2^64-1); a larger literal is refused, never read as a float."""

from __future__ import annotations

import json

import orjson
import pytest

from im_server.protocol.client_frames import FrameError, parse_client_frame
from im_server.protocol.json_ints import INT64_MAX, INT64_MIN, oversized_int
from im_server.protocol.session import Reply, Session


@pytest.mark.parametrize(
    "text",
    [
        str(2**70),
        str(INT64_MAX + 1),
        str(INT64_MIN - 1),
        '{"seq": 1180591620717411303424}',
        '{"content": {"n": [1, 2, {"deep": 99999999999999999999999}]}}',
        '{"text": "12345678901234567890123", "n": -9223372036854775809}',
        '{"text": "数字２３４５", "n": 123456789012345678901}',
        '{"text": "😀", "n": 99999999999999999999}',
    ],
)
def test_oversized_integers_are_found(text: str) -> None:
    assert oversized_int(text) is not None
    assert oversized_int(text.encode()) is not None


@pytest.mark.parametrize(
    "text",
    [
        str(INT64_MAX),
        str(INT64_MIN),
        "1e30",
        "-1.5e300",
        "123456789012345678.5",
        '{"text": "a phone number 12345678901234567890123 in a string"}',
        '{"n": 9223372036854775807, "m": -9223372036854775808}',
        str(2**63),
        "18446744073709551615",
        "{not json 12345678901234567890",
        "[" * 5000,
        # digits split by characters whose UTF-8 bytes are not digits: no run of 19
        '{"n": 1234567890, "m": "１２３４５６７８９０１２３４５６７８９０"}',
        '{"t": "123456789٠١٢٣٤٥٦٧٨٩0123456789"}',
        '{"t": "\udcff1234567890123456789"}',
    ],
)
def test_what_fits_or_is_not_an_integer_passes(text: str) -> None:
    assert oversized_int(text) is None
    assert oversized_int(text.encode("utf-8", "surrogatepass")) is None


def test_a_lone_surrogate_in_the_text_itself_is_no_crash() -> None:
    """Text from a WebSocket is valid UTF-8, but a str can hold a lone surrogate."""
    assert oversized_int('{"t": "\udcff", "n": 123456789012345678901}') is not None
    assert oversized_int('{"t": "\udcff", "n": 1}') is None


def test_orjson_alone_would_round_it() -> None:
    """Why the check exists: the parser keeps no integer past 2^64-1."""
    assert isinstance(orjson.loads(str(2**70)), float)


def test_a_frame_with_a_huge_integer_is_refused() -> None:
    with pytest.raises(FrameError) as e:
        parse_client_frame('{"type": "read", "conv_id": "s:1:2", "seq": 1180591620717411303424}')
    assert e.value.code == "bad_request" and "64 bits" in e.value.message


def test_a_send_with_a_huge_integer_in_content_gets_a_refused_ack() -> None:
    s = Session(1, "d", max_frame_bytes=65536)
    frame = {
        "type": "send",
        "client_msg_id": "m1",
        "conv_id": "s:1:2",
        "content_type": "text",
        "content": {"text": "x", "n": 2**70},
    }
    reply = s.receive(json.dumps(frame))
    assert isinstance(reply, Reply)
    ack = orjson.loads(reply.text)
    assert ack["type"] == "ack" and ack["ok"] is False and ack["code"] == "bad_request"
    assert ack["client_msg_id"] == "m1"
