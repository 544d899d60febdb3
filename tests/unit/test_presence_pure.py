"""Presence's pure parts: the ``user_ids`` query and the presence scripts' answers."""

from __future__ import annotations

import pytest

from im_server.errors import ImError
from im_server.services.presence import MAX_USER_IDS, check_user_ids
from im_server.storage.redis.replies import (
    ScriptReplyError,
    join_devices,
    parse_live_devices,
    parse_offlines,
    parse_user_ids,
)


def test_user_ids_in_order_without_repeats() -> None:
    assert check_user_ids("3,1,3,2") == [3, 1, 2]
    assert check_user_ids(str(2**63 - 1)) == [2**63 - 1]
    many = ",".join(str(i) for i in range(1, MAX_USER_IDS + 1))
    assert len(check_user_ids(many)) == MAX_USER_IDS
    # repeats count once, so the bound is on distinct ids
    assert check_user_ids(",".join(["7"] * 300)) == [7]


@pytest.mark.parametrize(
    "raw",
    [
        "",
        ",",
        "1,",
        ",1",
        "1,,2",
        "a",
        "0",
        "-1",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "0x10",
        "１",
        "١",  # an Arabic-Indic digit: str.isdigit says yes
        str(2**63),
        "9" * 21,
        ",".join(str(i) for i in range(1, MAX_USER_IDS + 2)),
        "1," * 5000,
    ],
)
def test_bad_user_ids(raw: str) -> None:
    with pytest.raises(ImError) as e:
        check_user_ids(raw)
    assert e.value.code == "bad_request"


def test_script_answers() -> None:
    assert parse_user_ids(["1", 2], "presence_set") == [1, 2]
    assert parse_offlines(["5", "1764412345678", 6, 7]) == [(5, 1764412345678), (6, 7)]
    for bad in (None, "1", ["x"]):
        with pytest.raises(ScriptReplyError):
            parse_user_ids(bad, "presence_set")
    for bad in (None, ["1"], ["1", "x"]):
        with pytest.raises(ScriptReplyError):
            parse_offlines(bad)


def test_devices_entry_round_trip() -> None:
    """A node's entry in a user's devices hash: sorted, space-joined, "" for none (the
    script's "no connection here"); read back only for live nodes."""
    assert join_devices({"phone", "a:b.c-d_e"}) == "a:b.c-d_e phone"
    assert join_devices(set()) == ""
    raw = {"n1": join_devices({"phone", "laptop"}), "n2": "tablet", "dead": "watch"}
    assert parse_live_devices(raw, {"n1", "n2", "elsewhere"}) == {"phone", "laptop", "tablet"}
    assert parse_live_devices(raw, {"n2"}) == {"tablet"}
    assert parse_live_devices(raw, set()) == set()
    assert parse_live_devices({}, {"n1"}) == set()
    # the same device on two live nodes counts once
    assert parse_live_devices({"n1": "phone", "n2": "phone"}, {"n1", "n2"}) == {"phone"}


def test_devices_entry_bad_shapes() -> None:
    for bad in (None, [], "phone", 1):
        with pytest.raises(ScriptReplyError):
            parse_live_devices(bad, {"n1"})
    with pytest.raises(ScriptReplyError):
        parse_live_devices({"n1": 5}, {"n1"})
