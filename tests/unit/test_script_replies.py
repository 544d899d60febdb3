"""The Lua scripts' raw replies, as redis-py hands them back (lists of str and int), turned
into typed results; anything off a script's contract is a ScriptReplyError."""

from __future__ import annotations

import pytest

from im_server.storage.redis.replies import (
    CHECK_DEDUPE,
    NEEDS_SEQ_BLOCK,
    REDIS_RESET,
    ScriptReplyError,
    SendCheckDedupe,
    SendDuplicate,
    SendNeedsPermissions,
    SendNeedsSeqBlock,
    SendOk,
    SendRedisReset,
    SendRefused,
    dedupe_value,
    parse_dedupe_value,
    parse_flag,
    parse_int_pair,
    parse_send,
)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (["ok", 42, "1700000000123", 0], SendOk(42, 1700000000123, False)),
        (["ok", 7, "5", 1], SendOk(7, 5, True)),
        (["dup", "s:1:2|9|1700000000000"], SendDuplicate("s:1:2", 9, 1700000000000)),
        (["dup", "g:12|1|2"], SendDuplicate("g:12", 1, 2)),
        (["denied", "not_friends"], SendRefused("not_friends")),
        (["denied", "blocked"], SendRefused("blocked")),
        (["denied", "not_member"], SendRefused("not_member")),
        (["perm_cold", "0"], SendNeedsPermissions("0")),
        (["perm_cold", "17"], SendNeedsPermissions("17")),
        (["need_block"], SendNeedsSeqBlock()),
        (["reset"], SendRedisReset()),
        (["check_pg"], SendCheckDedupe()),
    ],
)
def test_each_answer_of_the_send_script(raw: list[object], want: object) -> None:
    assert parse_send(raw) == want
    assert type(parse_send(raw)) is type(want)


def test_bare_answers_are_shared_values() -> None:
    assert parse_send(["need_block"]) is NEEDS_SEQ_BLOCK
    assert parse_send(["reset"]) is REDIS_RESET
    assert parse_send(["check_pg"]) is CHECK_DEDUPE


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "ok",
        42,
        [],
        ["nope"],
        ["OK", 1, "2", 0],
        ["ok", 1, "2"],  # too short
        ["ok", 1, "2", 0, 9],  # too long
        ["ok", "x", "2", 0],  # not a number
        ["ok", None, "2", 0],
        ["ok", 1, "2", "low"],
        ["dup", "s:1:2|9"],  # two fields
        ["dup", "s:1:2|9|x"],
        ["dup", "|9|1"],
        ["dup", 5],
        ["dup"],
        ["denied", "teapot"],  # not a refusal code of the contract
        ["denied"],
        ["perm_cold", 3],
        ["perm_cold"],
        ["need_block", 1],
        ["reset", "x"],
        [["ok", 1, "2", 0]],
    ],
)
def test_a_malformed_answer_is_a_clear_error(raw: object) -> None:
    with pytest.raises(ScriptReplyError, match="send script|dedupe value"):
        parse_send(raw)


def test_dedupe_value_round_trip() -> None:
    v = dedupe_value("g:3", 12, 1700000000999)
    assert v == "g:3|12|1700000000999"  # the shape send_batch.lua writes
    assert parse_dedupe_value(v) == SendDuplicate("g:3", 12, 1700000000999)


def test_a_long_reply_is_cut_in_the_message() -> None:
    with pytest.raises(ScriptReplyError) as e:
        parse_send(["x" * 10_000])
    assert len(str(e.value)) < 300


def test_int_pair_and_flag() -> None:
    assert parse_int_pair([5, 1005], "extend_seq") == (5, 1005)
    assert parse_int_pair(["5", "7"], "extend_seq") == (5, 7)
    for bad in (None, [1], [1, 2, 3], ["a", 1], 5):
        with pytest.raises(ScriptReplyError, match="extend_seq"):
            parse_int_pair(bad, "extend_seq")
    assert parse_flag(1, "lease") is True
    assert parse_flag(0, "lease") is False
    for flag in (None, 2, "1", [1]):
        with pytest.raises(ScriptReplyError, match="lease"):
            parse_flag(flag, "lease")
