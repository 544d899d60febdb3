"""The terminal client's pure parts: which typed words are mentions, and how a message,
its quote, its notices, pictures and files, and /list print; /file's arguments and
where /save writes (with a fake client that counts history fetches)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from im_server.client import ApiError
from im_server.client.chat import Chat
from im_server.client.chat_text import human_size, parse_mentions, save_new, snippet, split_path

ME, BOB = 1, 2
CONV = "g:7"


def test_mention_words() -> None:
    assert parse_mentions("hi @12 and @all, @12 again (@7)") == ([12, 7], True)
    assert parse_mentions("mail@12 @12x @@12 @allison @ 12 @-3") == ([], False)
    assert parse_mentions("@all") == ([], True)
    assert parse_mentions("end @9.") == ([9], False)
    assert parse_mentions("@\u0663") == ([], False)  # an Arabic-Indic digit is no id


@given(st.text(max_size=200))
def test_mention_words_never_fail(text: str) -> None:
    ids, _ = parse_mentions(text)
    assert len(ids) == len(set(ids)) and all(0 <= i < 10**19 for i in ids)
    assert all(f"@{i}" in text for i in ids)


def test_snippet_is_one_short_line() -> None:
    assert snippet("two\n  lines") == "two lines"
    long = snippet("x" * 100)
    assert len(long) == 60 and long.endswith("…")


def msg(seq: int, text: str | None = "hi", sender: int = BOB, **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "conv_id": CONV,
        "seq": seq,
        "sender_id": sender,
        "client_msg_id": f"c{seq}",
        "content_type": "text",
        "content": {"text": text} if text is not None else None,
        "server_time": 1764412345678,
        "recalled": text is None,
        "mentions": [],
        "mention_all": False,
        "reply_to": None,
        "edited_at": None,
        "reactions": [],
    }
    m.update(extra)
    return m


class FakeClient:
    user_id = ME

    def __init__(self, *held: dict[str, Any], error: bool = False) -> None:
        self.held = {m["seq"]: m for m in held}
        self.error = error
        self.fetches: list[tuple[str, int | None, int | None, int | None]] = []
        self.states: list[dict[str, Any]] = []
        self.counts = {"total": 0, "badge": 0, "conversations": []}

    async def conversations(self) -> list[dict[str, Any]]:
        return self.states

    async def unread(self) -> dict[str, Any]:
        return self.counts

    async def history(
        self,
        conv_id: str,
        begin: int | None = None,
        end: int | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> dict[str, Any]:
        self.fetches.append((conv_id, begin, end, limit))
        if self.error:
            raise ApiError(403, "not_member", "you left")
        return {"messages": [m for s, m in self.held.items() if begin == s == end]}


def chat(client: FakeClient) -> tuple[Chat, io.StringIO]:
    out = io.StringIO()
    c = Chat(client, Console(file=out, width=200, highlight=False))  # type: ignore[arg-type]
    c.conv = CONV
    c.names[BOB] = "bob"
    return c, out


async def test_quote_from_held_seen_or_one_seq_fetch() -> None:
    client = FakeClient(msg(3, "fetched original"))
    c, out = chat(client)
    c.device.messages[CONV] = {1: msg(1, "held original", sender=ME)}
    await c.show(msg(10, "a", reply_to=1))
    await c.show(msg(11, "b", reply_to=2), {2: msg(2, "on the page")})
    assert client.fetches == []
    await c.show(msg(12, "c", reply_to=3))
    assert client.fetches == [(CONV, 3, 3, 1)]  # one seq, once
    await c.show(msg(13, "d", reply_to=4))  # not visible: the fetch finds nothing
    lines = out.getvalue().splitlines()
    assert lines[0] == "  ↪ #1 me: held original"
    assert lines[2] == "  ↪ #2 bob: on the page"
    assert lines[4] == "  ↪ #3 bob: fetched original"
    assert lines[6] == "  ↪ #4 message unavailable"
    assert lines[7].endswith("#13 bob: d")


async def test_quote_of_a_conversation_i_cannot_read() -> None:
    c, out = chat(FakeClient(error=True))
    await c.show(msg(5, "x", reply_to=1))
    assert out.getvalue().splitlines()[0] == "  ↪ #1 message unavailable"


async def test_quote_of_a_recalled_message() -> None:
    c, out = chat(FakeClient(msg(1, None)))
    await c.show(msg(5, "x", reply_to=1))
    assert out.getvalue().splitlines()[0] == "  ↪ #1 bob: (recalled)"


@pytest.mark.parametrize(
    ("extra", "sender", "marked"),
    [
        ({"mentions": [ME]}, BOB, True),
        ({"mentions": [BOB, ME]}, BOB, True),
        ({"mention_all": True}, BOB, True),
        ({"mentions": [BOB]}, BOB, False),
        ({}, BOB, False),
        ({"mention_all": True}, ME, False),  # my own @all is not news to me
    ],
)
async def test_mentions_of_me_are_marked(extra: dict[str, Any], sender: int, marked: bool) -> None:
    c, out = chat(FakeClient())
    await c.show(msg(5, "look", sender=sender, **extra))
    assert ("@me" in out.getvalue()) is marked, out.getvalue()


async def test_edited_reactions_and_markup() -> None:
    c, out = chat(FakeClient())
    await c.show(
        msg(5, "[red]x[/", edited_at=1764412349999, reactions=[{"emoji": "👍", "count": 2}])
    )
    assert out.getvalue().rstrip().endswith("#5 bob: [red]x[/ 👍2 (edited)")


async def test_notices() -> None:
    c, out = chat(FakeClient())
    await c.show(
        msg(6, content_type="edit", content={"seq": 5, "content": {"text": "new [b]text"}})
    )
    for op, user in (("add", BOB), ("remove", ME)):
        content = {"seq": 5, "emoji": "🎉", "user_id": user, "op": op}
        await c.show(msg(7, content_type="reaction", content=content, sender=user))
    await c.show(msg(8, content_type="reaction", content={"seq": 5, "emoji": "x"}, conv_id="g:9"))
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("· #5 edited: new [b]text")
    assert lines[1].endswith("· bob reacted 🎉 to #5")
    assert lines[2].endswith("· me removed 🎉 from #5")
    assert lines[3].startswith("g:9 ")  # another conversation is named
    await c.show_presence({"type": "presence", "user_id": BOB, "online": True})
    await c.show_presence({"type": "presence", "user_id": 3, "online": False, "last_seen": 1})
    lines = out.getvalue().splitlines()
    assert lines[4].endswith("· bob is online")
    assert lines[5].endswith("· user 3 went offline")


def state(conv_id: str, unread: int = 0, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"conv_id": conv_id, "unread": unread, "mention_unread": 0}
    s.update({"muted": False, "pinned": False, **extra})
    return s


async def test_list_marks_and_badge() -> None:
    client = FakeClient()
    client.states = [
        state("g:7", 3, name="team [x]", pinned=True, muted=True, mention_unread=1),
        state("s:1:2", 2, peer_id=BOB, pinned=True),
        state("g:9", 5, name="loud", muted=True),
        state("s:1:3", peer_id=3),
    ]
    client.counts = {"total": 10, "badge": 3, "conversations": []}
    c, out = chat(client)
    await c.show_list()
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert lines[0] == "conversations · badge 3 (10 unread, muted ones included)"
    # the server's order is kept (pinned first); marks after the count
    assert lines[1] == f"@ {'g:7':<22} {'team [x]':<20} unread 3 pinned muted"
    assert lines[2] == f"  {'s:1:2':<22} {'bob':<20} unread 2 pinned"
    assert lines[3] == f"  {'g:9':<22} {'loud':<20} unread 5 muted"
    assert lines[4] == f"  {'s:1:3':<22} {'user 3':<20} unread 0"
    client.counts = {"total": 2, "badge": 2, "conversations": []}
    client.states = client.states[1:2]
    await c.show_list()
    assert out.getvalue().splitlines()[5:] == ["conversations · badge 2", lines[2]]


# -- pictures and files ---------------------------------------------------------------


async def test_pictures_and_files_print_name_size_and_caption() -> None:
    c, out = chat(FakeClient())
    picture = {"upload_id": "u" * 22, "name": "cat [1].jpg", "size": 250_000, "mime": "image/jpeg"}
    await c.show(msg(5, content_type="image", content={**picture, "width": 800, "height": 600}))
    doc = {"upload_id": "v" * 22, "name": "plan.pdf", "size": 999, "mime": "application/pdf"}
    await c.show(msg(6, content_type="file", content={**doc, "caption": "for [b]you[/]"}))
    await c.show(msg(7, content_type="file", content=doc, recalled=True))
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("#5 bob: [picture cat [1].jpg, 800×600, 250.0 KB]"), lines
    assert lines[1].endswith("#6 bob: [file plan.pdf, 999 B] for [b]you[/]"), lines
    assert lines[2].endswith("#7 bob: (recalled)"), lines


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 KB"),
        (4_200_000, "4.2 MB"),
        (3 * 10**12, "3000.0 GB"),
    ],
)
def test_human_size(n: int, shown: str) -> None:
    assert human_size(n) == shown


@pytest.mark.parametrize(
    ("typed", "path", "caption"),
    [
        (" a.png", "a.png", ""),
        (" ~/x.txt  look  at this ", "~/x.txt", "look  at this"),
        (' "my photos/b c.jpg" caption', "my photos/b c.jpg", "caption"),
        (" 'it''s.txt'", "its.txt", ""),
    ],
)
def test_file_arguments(typed: str, path: str, caption: str) -> None:
    assert split_path(typed) == (path, caption)


@pytest.mark.parametrize("typed", ["", "   ", ' "unclosed'])
def test_file_arguments_refused(typed: str) -> None:
    with pytest.raises(ValueError):
        split_path(typed)


def test_a_saved_file_never_replaces_one_nor_leaves_its_folder(tmp_path: Path) -> None:
    first = save_new(tmp_path, "notes.txt", b"one")
    second = save_new(tmp_path, "notes.txt", b"two")
    assert (first.name, second.name) == ("notes.txt", "notes (1).txt")
    assert first.read_bytes() == b"one" and second.read_bytes() == b"two"
    for hostile in ("../escape.txt", "..\\up.txt", "..", "", "/etc/passwd"):
        saved = save_new(tmp_path, hostile, b"x")
        assert saved.parent == tmp_path, (hostile, saved)


def test_conversation_ids_are_printed_as_they_are() -> None:
    import io

    from im_server.client.chat_main import make_console

    console = make_console()
    console.file = io.StringIO()
    console.print("now in s:100:101 and s:1:2 :smile:")
    assert console.file.getvalue().strip() == "now in s:100:101 and s:1:2 :smile:"
