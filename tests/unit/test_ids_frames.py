"""conv_id parsing and client_msg_id validation (pure; frame parsing is in
``test_protocol_frames.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from im_server.errors import ImError
from im_server.protocol.ids import group_conv_id, parse_conv_id, single_conv_id, valid_client_msg_id

MAX = 2**63 - 1


# -- parse_conv_id ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conv_id", "kind", "a", "b", "group_id"),
    [
        ("s:1:2", "single", 1, 2, 0),
        ("s:7:1000", "single", 7, 1000, 0),
        (f"s:1:{MAX}", "single", 1, MAX, 0),
        (f"s:{MAX - 1}:{MAX}", "single", MAX - 1, MAX, 0),
        ("g:5", "group", 0, 0, 5),
        ("g:1", "group", 0, 0, 1),
        (f"g:{MAX}", "group", 0, 0, MAX),
    ],
)
def test_parse_conv_id_valid(conv_id: str, kind: str, a: int, b: int, group_id: int) -> None:
    ref = parse_conv_id(conv_id)
    assert ref.conv_id == conv_id
    assert ref.kind == kind
    if kind == "single":
        assert (ref.a, ref.b) == (a, b)
        assert ref.has_user(a) and ref.has_user(b)
        assert not ref.has_user(0) and not ref.has_user(-a)
        assert ref.peer_of(a) == b and ref.peer_of(b) == a
    else:
        assert ref.group_id == group_id
        assert not ref.has_user(group_id)


@pytest.mark.parametrize(
    "conv_id",
    [
        "s:2:1",  # a > b
        "s:1:1",  # a == b
        "s:0:1",  # zero id
        "s:1:0",
        "g:0",
        "x:1",
        "S:1:2",
        "G:5",
        "s:01:2",  # leading zeros
        "s:1:02",
        "g:05",
        "g:00",
        f"g:{MAX + 1}",  # above 2^63-1
        f"s:1:{MAX + 1}",
        "g:99999999999999999999",
        "s:1:99999999999999999999",
        "g:-1",
        "s:-1:2",
        "g:+1",
        "g:1.0",
        "g:1e3",
        "g:",
        "s:1:",
        "s:1",
        "s::2",
        "s:1:2:3",
        "g:1:2",
        "",
        "g",
        "s",
        " g:1",
        "g:1 ",
        "g: 1",
        "g:1\n",  # a trailing newline is not the same id
        "s:1:2\n",
        "g:\u0661",  # a non-ASCII digit
        "g:" + "1" * 100,
    ],
)
def test_parse_conv_id_invalid(conv_id: str) -> None:
    with pytest.raises(ImError) as exc:
        parse_conv_id(conv_id)
    assert exc.value.code == "bad_request"
    assert exc.value.status == 400


@pytest.mark.parametrize("value", [None, 5, 1.5, b"s:1:2", ["g:1"], {"conv_id": "g:1"}, True])
def test_parse_conv_id_non_strings(value: Any) -> None:
    with pytest.raises(ImError) as exc:
        parse_conv_id(value)
    assert exc.value.code == "bad_request"


def test_conv_id_builders_round_trip() -> None:
    assert single_conv_id(9, 3) == single_conv_id(3, 9) == "s:3:9"
    assert parse_conv_id(single_conv_id(9, 3)).a == 3
    assert group_conv_id(42) == "g:42"
    assert parse_conv_id(group_conv_id(42)).group_id == 42


# -- valid_client_msg_id -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a", "A", "0", "-", "_", "abc-DEF_123", "6f1c2b0e-9a4b-4c1d-8e2f-0123456789ab", "x" * 64],
)
def test_valid_client_msg_id(value: str) -> None:
    assert valid_client_msg_id(value) is True


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 65,
        "a b",
        "a/b",
        "a.b",
        "a:b",
        "é",
        "a\n",  # a trailing newline is outside [A-Za-z0-9_-]
        "\na",
        "a\x00",
        None,
        5,
        b"abc",
        ["abc"],
    ],
)
def test_invalid_client_msg_id(value: Any) -> None:
    assert valid_client_msg_id(value) is False
