"""The pure rules of edits and reactions: what an edit notice carries for the persister,
which edit of a batch wins, the notice's id, and the emoji rule."""

from __future__ import annotations

import pytest

from im_server.protocol.types import SERVER_CONTENT_TYPES, valid_client_msg_id, valid_emoji
from im_server.services.edits import edit_of, notice_client_msg_id
from im_server.storage.conversations import NOT_UNREAD_TYPES
from im_server.storage.edits import Edit, newest
from im_server.storage.messages import NewMessage


def notice(seq: int, content_json: str, ctype: str = "edit") -> NewMessage:
    return NewMessage("g:7", seq, 1, f"n{seq}", ctype, content_json, 1000 + seq)


def test_edit_of_a_notice() -> None:
    assert edit_of(notice(9, '{"seq":3,"content":{"text":"b"}}')) == Edit(
        "g:7", 3, '{"text":"b"}', 9, 1009
    )


@pytest.mark.parametrize(
    "content_json",
    ['{"seq":true,"content":{}}', '{"seq":3,"content":"x"}', '{"seq":3}', "[1]", "not json"],
)
def test_a_malformed_edit_notice_names_nothing(content_json: str) -> None:
    assert edit_of(notice(9, content_json)) is None


def test_other_messages_are_not_edits() -> None:
    assert edit_of(notice(9, '{"seq":3,"content":{"text":"b"}}', "text")) is None


def test_the_newest_edit_of_a_message_wins() -> None:
    a = Edit("g:7", 3, "{}", 9, 1)
    b = Edit("g:7", 3, "{}", 11, 2)
    c = Edit("g:1", 5, "{}", 10, 3)
    assert newest([b, a, c]) == [c, b]  # (conv, seq) order: a fixed lock order


def test_the_notice_id_is_the_same_for_the_same_edit_only() -> None:
    one = notice_client_msg_id("g:7", 3, None, '{"text":"b"}')
    assert valid_client_msg_id(one) and one.startswith("edit-")
    assert one == notice_client_msg_id("g:7", 3, None, '{"text":"b"}')
    assert one != notice_client_msg_id("g:7", 3, 9, '{"text":"b"}')  # after another edit
    assert one != notice_client_msg_id("g:7", 4, None, '{"text":"b"}')
    assert one != notice_client_msg_id("g:8", 3, None, '{"text":"b"}')


def test_notices_are_the_servers_and_never_unread() -> None:
    assert {"edit", "reaction"} <= SERVER_CONTENT_TYPES
    assert set(SERVER_CONTENT_TYPES) == set(NOT_UNREAD_TYPES)


@pytest.mark.parametrize(
    "emoji",
    # a picture, a skin tone, a ZWJ family, a heart with its variation selector, a flag,
    # a keycap, a ZWJ flag, the web client's picker
    ["👍", "👍🏽", "👨‍👩‍👧", "❤️", "🇫🇷", "1️⃣", "🏳️‍🌈", "🫠"]
    + ["👍", "❤️", "😂", "😮", "😢", "🎉", "🙏", "👀", "🔥", "👏", "✅", "🤔"],
)
def test_emojis_accepted(emoji: str) -> None:
    assert valid_emoji(emoji)


@pytest.mark.parametrize(
    "emoji",
    [
        "",
        " ",
        "a b",
        "x" * 33,
        "\t",
        "\n",
        "\x00",
        "\x7f",
        "\u2028",
        "\u3000",
        "\ud800",
        "\ufffd",
        1,
        # free text and shortcodes: not one emoji
        "+1",
        ":tada:",
        "x" * 32,
        "a/b",
        "a",
        # two emojis, a skin tone alone, a bare joiner, the unqualified spellings of
        # emojis that have a fully-qualified one (one spelling per picture)
        "👍👍",
        "🏽",
        "\u200d",
        "❤",
        "1⃣",
        "👍 ",
    ],
)
def test_emojis_refused(emoji: object) -> None:
    assert not valid_emoji(emoji)
