"""`im-server chat`, the terminal client: it sends what is typed and prints what arrives,
including replies (with their quote), edits, reactions, mentions, presence, pictures and
files (sent by path, saved by seq), and sets mute and pin. Each test drives the real command in a child process and reads its output."""

from __future__ import annotations

import asyncio
import io
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from im_server.client import Client, Connection, ServerClient, group_conv_id
from tests.support import (
    PASSWORD,
    Make,
    ServerProcess,
    Stores,
    api_key,
    befriend,
    eventually,
    persisted,
    send_ok,
)

# presence announced within a second; edits allowed for one second only
QUICK_ENV = {
    "IM_PRESENCE_BEAT_SECONDS": "0.2",
    "IM_PRESENCE_NODE_TTL_SECONDS": "2",
    "IM_PRESENCE_SWEEP_SECONDS": "0.2",
    "IM_PRESENCE_OFFLINE_GRACE_SECONDS": "0.5",
    "IM_EDIT_WINDOW_SECONDS": "1",
}


class Tty:
    """``im-server chat`` in a child process, signed in as an existing user. Output is
    read forwards: each :meth:`expect` consumes up to its match, so a later one cannot
    be satisfied by an earlier line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.out = ""
        self.pos = 0
        self._raw = b""

    @classmethod
    async def start(cls, url: str, user: Client, token: str | None = None) -> Tty:
        """Signed in with the user's password, or with ``token`` (in ``IM_TOKEN``)."""
        env = {"COLUMNS": "200", "TERM": "dumb", "PATH": "/usr/bin:/bin"}
        who = ["--user", str(user.username), "--password", PASSWORD]
        if token is not None:
            env["IM_TOKEN"], who = token, []
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "im_server",
            "chat",
            "--url",
            url,
            *who,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        tty = cls(proc)
        await tty.expect("signed in as")
        return tty

    async def type(self, *lines: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{line}\n" for line in lines).encode())
        await self.proc.stdin.drain()

    async def expect(self, pattern: str, timeout: float = 10.0) -> str:
        """Wait for ``pattern`` (a regex, ``^``/``$`` at line ends) in the output not
        consumed yet; return the whole line it matched in, and consume the output up to
        the end of that line."""
        rx = re.compile(pattern, re.MULTILINE)

        async def _read() -> str:
            while True:
                m = rx.search(self.out, self.pos)
                if m is not None:
                    start = self.out.rfind("\n", 0, m.start()) + 1
                    end = self.out.find("\n", m.end())
                    end = len(self.out) if end < 0 else end
                    self.pos = end
                    return self.out[start:end]
                assert self.proc.stdout is not None
                chunk = await self.proc.stdout.read(4096)
                if not chunk:
                    raise AssertionError(f"chat exited; output so far:\n{self.out}")
                self._raw += chunk
                self.out = self._raw.decode(errors="replace")

        try:
            return await asyncio.wait_for(_read(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"{pattern!r} not printed within {timeout} s; output so far:\n{self.out}"
            ) from None

    async def quit(self) -> str:
        """Leave with /quit; return everything printed (checked for tracebacks)."""
        await self.type("/quit")
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), 10)
        self.out = (self._raw + rest).decode(errors="replace")
        assert await asyncio.wait_for(self.proc.wait(), 10) == 0
        assert "Traceback" not in self.out, self.out
        return self.out


StartTty = Callable[..., Awaitable[Tty]]


@pytest.fixture
async def tty(url: str) -> AsyncIterator[StartTty]:
    started: list[Tty] = []

    async def start(user: Client, base: str | None = None) -> Tty:
        t = await Tty.start(base or url, user)
        started.append(t)
        return t

    yield start
    for t in started:
        if t.proc.returncode is None:
            t.proc.kill()
            await t.proc.wait()


@pytest.fixture(scope="module")
def quick(stores: Stores) -> Iterator[ServerProcess]:
    """A server of its own with fast presence and a one-second edit window."""
    srv = ServerProcess(env={**stores.env(), **QUICK_ENV}).start()
    yield srv
    srv.terminate()


async def _message(conn: Connection, ctype: str = "text", **match: Any) -> dict[str, Any]:
    def ok(f: dict[str, Any]) -> bool:
        m = f["message"]
        return m["content_type"] == ctype and all(m.get(k) == v for k, v in match.items())

    ev = await conn.next_event("message", timeout=10, predicate=ok)
    return dict(ev["message"])


async def test_terminal_chat_sends_and_receives(url: str, tty: StartTty, make: Make) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    cb = await bob.connect()
    t = await tty(alice)
    await t.type(f"/open {bob.user_id}", "hello from the terminal")
    ev = await cb.next_event("message", timeout=10)
    assert (
        ev["message"]["content"] == {"text": "hello from the terminal"}
        and ev["message"]["conv_id"] == conv
    )
    await cb.send(conv, "hello back")
    await t.expect("hello back")
    await t.type("/list")
    await t.expect(re.escape(conv))
    await t.quit()


async def test_terminal_chat_signs_in_with_a_minted_token(
    url: str, stores: Stores, make: Make
) -> None:
    bob = await make("peer")
    async with ServerClient(url, await api_key(stores)) as app:
        ext = f"tty-{uuid.uuid4().hex[:8]}"
        made = await app.put_user(ext, display_name="Tty App User")
        minted = await app.mint_token(ext, device_id="terminal")
    user = Client(url, minted["token"], user_id=made["user_id"])
    conv = await bob.request("POST", "/v1/friends/requests", json={"to_user_id": made["user_id"]})
    await user.accept_friend(conv["request_id"])
    cb = await bob.connect()
    t = await Tty.start(url, user, token=minted["token"])
    await t.type(f"/open {bob.user_id}", "hello with a minted token")
    ev = await cb.next_event("message", timeout=10)
    assert ev["message"]["sender_id"] == made["user_id"]
    await t.quit()
    await user.aclose()


async def test_reply_command_and_quotes(tty: StartTty, make: Make) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    gone = await send_ok(bob, conv, "cleared away")
    await persisted(alice, conv, gone)
    await alice.clear(conv)  # alice can no longer see `gone`; bob still can
    first = await send_ok(bob, conv, "the very first\nof all")
    for i in range(24):  # more than the sync's 20 recent and /open's 10
        await send_ok(bob, conv, f"filler {i}")
    r1 = await bob.send_rest(conv, "answering the first", reply_to=first)
    r2 = await bob.send_rest(conv, "answering the cleared", reply_to=gone)
    await persisted(alice, conv, int(r2["seq"]))

    t = await tty(alice)
    t.pos = 0  # read what came before the sign-in line too
    # the startup snapshot: one original is shown, one is not visible
    line = await t.expect(rf"↪ #{first} ")
    assert line.endswith(f"  ↪ #{first} {bob.username}: the very first of all"), line
    await t.expect(rf"#{r1['seq']} {bob.username}: answering the first")
    line = await t.expect(rf"↪ #{gone} ")
    assert line.endswith(f"  ↪ #{gone} message unavailable"), line
    await t.expect(rf"#{r2['seq']} {bob.username}: answering the cleared")

    cb = await bob.connect()
    await t.type(f"/open {bob.user_id}", f"/reply {first}   back to you @{bob.user_id}")
    got = await _message(cb, reply_to=first)
    # the text is sent as typed; a single chat takes no mentions
    assert got["content"] == {"text": f"back to you @{bob.user_id}"}
    assert got["mentions"] == [] and got["mention_all"] is False
    # a live reply to the terminal's own message quotes it as mine
    await cb.send(conv, "noted", reply_to=got["seq"])
    line = await t.expect(rf"↪ #{got['seq']} ")
    assert line == f"  ↪ #{got['seq']} me: back to you @{bob.user_id}", line
    await t.expect(rf"{bob.username}: noted")
    # a seq nobody can see: the server's refusal, printed
    await t.type("/reply 999999 into the void")
    await t.expect(r"not sent: bad_request \S")
    await t.quit()
    await cb.close()


async def test_edit_command_and_notices(tty: StartTty, make: Make) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    cb = await bob.connect()
    t = await tty(alice)
    await t.type(f"/open {bob.user_id}", "helo wrld")
    seq = (await _message(cb))["seq"]
    # an edit that changes nothing (the message was never edited): no notice
    await t.type(f"/edit {seq} helo wrld")
    await t.expect(rf"#{seq} unchanged$")
    await t.type(f"/edit {seq} hello world")
    notice = await _message(cb, "edit")
    assert notice["content"] == {"seq": seq, "content": {"text": "hello world"}}
    await t.expect(rf"#{seq} edited: hello world$")
    # history shows the new text, marked (once the edit is in PostgreSQL: the ack and the
    # notice come first)
    await persisted(alice, conv, notice["seq"])

    async def shows_the_edit() -> bool:
        msgs = (await alice.history(conv, begin=seq, end=seq))["messages"]
        return bool(msgs) and msgs[0]["content"] == {"text": "hello world"}

    await eventually(shows_the_edit)
    await t.type("/history 5")
    # the history page's line: the terminal's own copy of the message, which its device
    # may print late (a gap filled while the edit was on its way), can still be unread
    # output with the old text
    line = await t.expect(rf"#{seq} me: hello world")
    assert line.endswith("me: hello world (edited)"), line
    # another user's edit reaches the terminal as a notice
    theirs = await send_ok(bob, conv, "bob wrote this")
    await bob.edit(conv, theirs, "bob rewrote this")
    await t.expect(rf"#{theirs} edited: bob rewrote this")
    # errors: the server's status, code and message; bad arguments: the help
    await t.type(f"/edit {theirs} not mine")
    await t.expect(r"403 forbidden: \S")
    await t.type("/edit x y", f"/edit {seq}")
    await t.expect(r"/edit <seq> <text>")
    await t.expect(r"/edit <seq> <text>")
    await t.quit()
    assert (await alice.history(conv, begin=theirs, end=theirs))["messages"][0]["content"] == {
        "text": "bob rewrote this"
    }
    await cb.close()


async def test_react_commands_and_notices(tty: StartTty, make: Make) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    seq = await send_ok(bob, conv, "react here")
    cb = await bob.connect()
    t = await tty(alice)
    await t.type(f"/open {bob.user_id}", f"/react {seq} 👍")
    got = await _message(cb, "reaction", sender_id=alice.user_id)
    assert got["content"] == {"seq": seq, "emoji": "👍", "user_id": alice.user_id, "op": "add"}
    await t.expect(rf"me reacted 👍 to #{seq}$")
    await bob.react(conv, seq, "🎉")
    await t.expect(rf"{bob.username} reacted 🎉 to #{seq}$")
    await t.type(f"/unreact {seq} 👍")
    got = await _message(cb, "reaction", sender_id=alice.user_id)
    assert got["content"]["op"] == "remove"
    await t.expect(rf"me removed 👍 from #{seq}$")
    # history shows the counts beside the message
    await persisted(alice, conv, got["seq"])
    await t.type("/history 5")
    line = await t.expect(rf"#{seq} {bob.username}: react here")
    assert line.endswith("react here 🎉1"), line
    # limits and bad emojis: the server's answer, printed
    for i in range(10):
        await alice.react(conv, seq, chr(0x1F600 + i))
    await t.type(f"/react {seq} 🧀")
    await t.expect(r"409 conflict: \S")
    await t.type(f"/react {seq} {'x' * 40}")
    await t.expect(r"400 bad_request: \S")
    await t.type(f"/react {seq}")  # no emoji
    await t.expect(r"/react <seq> <emoji>")
    await t.quit()
    await cb.close()


async def test_mentions_sent_highlighted_and_listed(tty: StartTty, make: Make) -> None:
    alice, bob, carol = await make("tty"), await make("own"), await make("car")
    await befriend(alice, bob)
    g = await bob.create_group("mentions", [alice.user_id, carol.user_id])
    gid, conv = int(g["group_id"]), group_conv_id(g["group_id"])
    t = await tty(alice)
    # mentions of me (by id, or everyone) are marked; others' are not
    await bob.send_rest(conv, "ping alice", mentions=[alice.user_id])
    await bob.send_rest(conv, "everyone look", mention_all=True)
    last = await bob.send_rest(conv, "just carol", mentions=[carol.user_id])
    line = await t.expect(r"ping alice")
    assert re.search(rf"#\d+ @me {bob.username}: ping alice$", line), line
    line = await t.expect(r"everyone look")
    assert re.search(rf"#\d+ @me {bob.username}: everyone look$", line), line
    line = await t.expect(r"just carol")
    assert "@me" not in line, line
    # /list marks the group while mentions are unread, not the single chat
    await persisted(alice, conv, int(last["seq"]))
    await t.type("/list")
    line = await t.expect(re.escape(conv) + " ")
    assert line.startswith(f"@ {conv} "), line
    line = await t.expect(r"s:\d+:\d+ ")
    assert line.startswith("  s:"), line
    # opening the group reads them; the mark goes
    await t.type(f"/open {conv}")
    await t.expect(r"just carol")

    async def read() -> bool:
        states = await alice.conversations()
        return any(s["conv_id"] == conv and s["mention_unread"] == 0 for s in states)

    await eventually(read)
    await t.type("/list")
    line = await t.expect(re.escape(conv) + " ")
    assert line.startswith(f"  {conv} "), line

    # typed @<user_id> words become mentions; the text is sent as typed
    cc = await carol.connect()
    text = f"hi @{carol.user_id} and @{bob.user_id}, not mail@{carol.user_id} nor @{carol.user_id}x"
    await t.type(text)
    got = await _message(cc, content={"text": text})
    assert got["mentions"] == sorted([carol.user_id, bob.user_id]) and not got["mention_all"]
    # @all is for owners and admins: the refusal is printed, nothing is sent
    await t.type("@all look here")
    await t.expect(r"not sent: forbidden \S")
    await bob.request(
        "PUT", f"/v1/groups/{gid}/members/{alice.user_id}/role", json={"role": "admin"}
    )
    await t.type("@all look now")
    got = await _message(cc, content={"text": "@all look now"})
    assert got["mention_all"] is True and got["mentions"] == []
    assert await cc.try_next_event("message", timeout=0.3) is None  # "look here" never came
    await t.quit()
    await cc.close()


async def test_presence_events_and_online(quick: ServerProcess, make: Make) -> None:
    alice, bob = await make("tty", quick.url), await make("peer", quick.url)
    carol = await make("quiet", quick.url)
    await befriend(alice, bob)
    await befriend(alice, carol)
    t = await Tty.start(quick.url, alice)
    try:
        cb = await bob.connect()
        await t.expect(rf"{bob.username} is online$")
        await t.type("/online")
        line = await t.expect(rf"{bob.user_id}\s+{bob.username} ")
        assert line.endswith("online") and "last seen" not in line, line
        line = await t.expect(rf"{carol.user_id}\s+{carol.username} ")
        assert line.endswith(" offline"), line  # never connected
        await cb.close()
        await t.expect(rf"{bob.username} went offline$")
        await t.type("/online")
        line = await t.expect(rf"{bob.user_id}\s+{bob.username} ")
        assert re.search(r"last seen (\d{4}-\d\d-\d\d )?\d\d:\d\d$", line), line
        await t.quit()
    finally:
        if t.proc.returncode is None:
            t.proc.kill()
            await t.proc.wait()


async def test_edit_window_refusal_is_printed(quick: ServerProcess, make: Make) -> None:
    alice, bob = await make("tty", quick.url), await make("peer", quick.url)
    conv = await befriend(alice, bob)
    seq = await send_ok(alice, conv, "soon frozen")
    t = await Tty.start(quick.url, alice)
    try:
        await asyncio.sleep(1.5)  # under test: the one-second edit window runs out
        await t.type(f"/open {bob.user_id}", f"/edit {seq} too late")
        await t.expect(r"403 forbidden: \S")
        await t.quit()
    finally:
        if t.proc.returncode is None:
            t.proc.kill()
            await t.proc.wait()
    assert (await alice.history(conv, begin=seq, end=seq))["messages"][0]["content"] == {
        "text": "soon frozen"
    }


async def test_bad_input_never_breaks_the_terminal(tty: StartTty, make: Make) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    cb = await bob.connect()
    t = await tty(alice)
    # commands that need an open conversation say so
    await t.type("/reply 1 hi", "/react 1 👍")
    await t.expect("open a conversation first")
    await t.expect("open a conversation first")
    await t.type(f"/open {bob.user_id}")
    await t.expect(f"now in {conv}")
    for line in ("/reply", "/reply x y", "/edit", "/react 1", "/unreact 1 a b"):
        await t.type(line)
        await t.expect(r"^commands:$")
    await t.type(f"/react {2**70} 👍", "/reply -1 negative")
    await t.expect(r"(400|422) bad_request: \S")
    await t.expect(r"not sent: bad_request \S")
    # markup in what others send is printed as typed, not interpreted
    await cb.send(conv, "[red]not markup[/ and [bold]")
    await t.expect(re.escape("[red]not markup[/ and [bold]"))
    await t.type("[blue]mine[/]")
    got = await _message(cb)
    assert got["content"] == {"text": "[blue]mine[/]"}
    await t.type("/me")
    await t.expect(str(alice.username))
    await t.quit()
    await cb.close()


async def _flags(c: Client, conv: str) -> tuple[bool, bool]:
    """My ``(muted, pinned)`` of a conversation, read back over REST."""
    state = next(s for s in await c.conversations() if s["conv_id"] == conv)
    return bool(state["muted"]), bool(state["pinned"])


async def test_mute_pin_commands_and_list_marks(tty: StartTty, make: Make) -> None:
    alice, bob, carol = await make("tty"), await make("own"), await make("car")
    single = await befriend(alice, bob)
    group = str((await bob.create_group("muted", [alice.user_id]))["conv_id"])
    others = str((await bob.create_group("not mine", [carol.user_id]))["conv_id"])
    await send_ok(bob, single, "in the single chat")
    t = await tty(alice)
    # no open conversation: the hint; extra words: the help
    await t.type("/mute", "/pin")
    await t.expect("open a conversation first")
    await t.expect("open a conversation first")
    await t.type(f"/open {group}", "/mute now")
    await t.expect(r"^commands:$")
    assert await _flags(alice, group) == (False, False)

    await t.type("/mute", "/pin")
    await t.expect(rf"^{re.escape(group)} muted$")
    await t.expect(rf"^{re.escape(group)} pinned$")
    assert await _flags(alice, group) == (True, True)
    assert await _flags(bob, group) == (False, False)  # mine alone

    # the single chat is read by opening it; the muted group gets two, one a mention
    await t.type(f"/open {bob.user_id}")
    await t.expect(f"now in {single}")
    await send_ok(bob, group, "muted chatter")
    last = await bob.send_rest(group, "but this is for you", mentions=[alice.user_id])
    await persisted(alice, group, int(last["seq"]))

    async def counted() -> bool:
        got = await alice.unread()
        return (got["total"], got["badge"]) == (2, 1)

    await eventually(counted)
    await t.type("/list")
    await t.expect(r"^conversations · badge 1 \(2 unread, muted ones included\)$")
    line = await t.expect(re.escape(group) + " ")
    assert line.startswith(f"@ {group} ") and line.endswith("unread 2 pinned muted"), line
    line = await t.expect(re.escape(single) + " ")  # after the pinned one
    assert line.startswith(f"  {single} ") and line.endswith("unread 0"), line

    # the open conversation only: the single chat changes, the group keeps its settings
    await t.type("/pin")
    await t.expect(rf"^{re.escape(single)} pinned$")
    assert await _flags(alice, single) == (False, True)
    await t.type(f"/open {group}", "/unmute", "/unpin")
    await t.expect(rf"^{re.escape(group)} unmuted$")
    await t.expect(rf"^{re.escape(group)} unpinned$")
    assert await _flags(alice, group) == (False, False)
    assert await _flags(alice, single) == (False, True)

    # the server's refusal: status, code and message
    await t.type(f"/open {others}")
    await t.expect(r"403 not_member: \S")  # the history
    await t.type("/mute")
    await t.expect(r"403 not_member: \S")
    await t.type("/open s:x:y", "/pin")
    await t.expect(r"400 bad_request: \S")
    await t.expect(r"400 bad_request: \S")
    await t.quit()


async def test_file_command_sends_pictures_and_files_and_save_gets_them(
    tty: StartTty, make: Make, tmp_path: Path
) -> None:
    alice, bob = await make("tty"), await make("peer")
    conv = await befriend(alice, bob)
    cb = await bob.connect()
    t = await tty(alice)
    photo = tmp_path / "my photo.png"
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, "PNG")
    photo.write_bytes(buf.getvalue())
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"plain notes\n" * 1000)
    fake = tmp_path / "fake.png"  # named like a picture, not one
    fake.write_bytes(b"not a picture at all")
    await t.type("/file notes.txt")
    await t.expect("open a conversation first")
    await t.type(f"/open {bob.user_id}", f'/file "{photo}"  a red  square', f"/file {notes}")
    pic = await _message(cb, "image")
    assert pic["content"]["name"] == "my photo.png" and pic["content"]["caption"] == "a red  square"
    assert (pic["content"]["width"], pic["content"]["height"]) == (64, 48)
    await persisted(bob, conv, pic["seq"])  # access follows the stored message
    assert await bob.download(pic["content"]["upload_id"]) == photo.read_bytes()
    doc = await _message(cb, "file")
    assert doc["content"]["size"] == 12_000 and doc["content"]["mime"] == "text/plain"
    await t.expect(rf"#{pic['seq']} sent: \[picture my photo.png, \S+ \S+\] a red  square")
    await t.expect(rf"#{doc['seq']} sent: \[file notes.txt, 12.0 KB\]")
    # a file that is not the picture its name says still goes, as a file
    await t.type(f"/file {fake}")
    assert (await _message(cb, "file"))["content"]["name"] == "fake.png"
    await t.expect(r"sent: \[file fake.png, 20 B\]")
    # what bob sends is saved under its name, never over a file already there
    data = b"%PDF-1.7 " + bytes(range(256)) * 40
    up = await bob.upload(data, "application/pdf", "plan.pdf")
    sent = await bob.send_rest(conv, {"upload_id": up, "caption": "the plan"}, "file")
    await t.expect(rf"#{sent['seq']} {bob.username}: \[file plan.pdf, 10.2 KB\] the plan")
    await persisted(alice, conv, sent["seq"])
    saved = tmp_path / "saved"
    await t.type(f"/save {sent['seq']} {saved}", f"/save {sent['seq']} {saved}")
    await t.expect(r"saved to .*plan\.pdf$")
    await t.expect(r"saved to .*plan \(1\)\.pdf$")
    assert (saved / "plan.pdf").read_bytes() == data == (saved / "plan (1).pdf").read_bytes()
    # bad input: a missing file, a message that holds no file, one that is not there
    await t.type(f"/file {tmp_path / 'missing.txt'}", f"/save {sent['seq'] + 50}", "/save -1")
    await t.expect("no such file")
    await t.expect("is no picture or file here")
    await t.expect(r"400 bad_request: \S")
    await t.type("/file")
    await t.expect(r"^commands:$")
    await bob.recall(conv, int(sent["seq"]))
    await t.expect(f"message {sent['seq']} was recalled")
    await t.type(f"/save {sent['seq']} {saved}")
    await t.expect("was recalled")
    assert sorted(p.name for p in saved.iterdir()) == ["plan (1).pdf", "plan.pdf"]
    await t.quit()
    await cb.close()
