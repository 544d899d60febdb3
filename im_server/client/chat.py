"""The terminal chat of ``im-server chat`` (``chat_main.py``), on the Python client:
lines you type are sent to the open conversation; commands start with /. What it prints
and parses is in ``chat_text.py``."""

from __future__ import annotations

import asyncio
import mimetypes
import sys
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from im_server.client import ApiError, Client, ConnectionLost, Device, JsonObject, TransportError
from im_server.client.chat_text import (
    ATTACHMENTS,
    HELP,
    NO_CONV,
    PICTURE_TYPES,
    SETTINGS,
    Show,
    attachment,
    body,
    clock,
    list_line,
    local_file,
    parse_mentions,
    save_new,
    snippet,
    split_path,
    upload_bar,
)


class Chat:
    """The terminal client. Everything it prints about messages and presence goes through
    one queue, shown in arrival order by :meth:`printer`: a reply's quote may need a
    history fetch, and the lines after it must not overtake it."""

    def __init__(self, client: Client, console: Console) -> None:
        self.client = client
        self.console = console
        self.conv: str | None = None
        self.names: dict[int, str] = {}
        self.device = Device(client, on_message=self.on_message, queue_events=False)
        self.queue: asyncio.Queue[Show] = asyncio.Queue()

    def name(self, user_id: int) -> str:
        return self.names.get(user_id, f"user {user_id}")

    def who(self, user_id: int) -> str:
        """A user as printed (markup-safe): ``me`` or the name."""
        return "me" if user_id == self.client.user_id else escape(self.name(user_id))

    # -- what arrives ----------------------------------------------------------------
    def on_message(self, m: JsonObject) -> None:
        """Device callback: show the message (in order) and read it if it is open."""
        self.queue.put_nowait(partial(self.show, m))
        self.mark_read(m)

    def on_event(self, frame: JsonObject) -> None:
        """Connection callback for frames other than messages (presence)."""
        if frame.get("type") == "presence":
            self.queue.put_nowait(partial(self.show_presence, frame))

    def mark_read(self, m: Mapping[str, Any]) -> None:
        mine = m["sender_id"] == self.client.user_id
        if not mine and m["conv_id"] == self.conv and self.device.conn is not None:
            asyncio.get_running_loop().create_task(self.device.conn.read(m["conv_id"], m["seq"]))

    async def printer(self) -> None:
        while True:
            show = await self.queue.get()
            try:
                await show()
            except Exception as e:  # noqa: BLE001 - one bad message must not stop the display
                self.console.print(f"[red]could not show a message: {escape(repr(e))}[/]")
            finally:
                self.queue.task_done()

    async def show(
        self, m: Mapping[str, Any], seen: Mapping[int, JsonObject] | None = None
    ) -> None:
        """Print one message; ``seen``: other messages of its conversation at hand (a
        history page), for its quote."""
        when = time.strftime("%H:%M", time.localtime(m["server_time"] / 1000))
        mine = m["sender_id"] == self.client.user_id
        where = "" if m["conv_id"] == self.conv else f"[dim]{escape(m['conv_id'])}[/] "
        kind = m["content_type"]
        c = m["content"] if isinstance(m["content"], dict) else {}
        if kind == "system":
            self.console.print(
                f"{where}[dim]{when} · {escape(str(c.get('event', 'system')))} "
                f"{escape(str(c.get('user_ids', '')))}[/]"
            )
        elif kind == "recall":
            self.console.print(f"{where}[dim]{when} · message {c.get('seq')} was recalled[/]")
        elif kind == "edit":
            new = body({"content": c.get("content"), "content_type": "edit"})
            self.console.print(f"{where}[dim]{when} ·[/] #{c.get('seq')} edited: {escape(new)}")
        elif kind == "reaction":
            emoji = escape(str(c.get("emoji")))
            did = f"reacted {emoji} to" if c.get("op") == "add" else f"removed {emoji} from"
            user = self.who(int(c.get("user_id") or m["sender_id"]))
            self.console.print(f"{where}[dim]{when} ·[/] {user} {did} #{c.get('seq')}")
        else:
            if m.get("reply_to") is not None:
                quote = await self.quote(m["conv_id"], int(m["reply_to"]), seen or {})
                self.console.print(f"{where}[dim]  ↪ #{m['reply_to']} {quote}[/]")
            who = "[bold green]me[/]" if mine else f"[bold cyan]{self.who(m['sender_id'])}[/]"
            text = escape(body(m))
            tail = "".join(
                f" {escape(str(r.get('emoji')))}{r.get('count')}"
                for r in m.get("reactions") or []
                if isinstance(r, dict)
            )
            if m.get("edited_at") and not m.get("recalled"):
                tail += " [dim](edited)[/]"
            me = self.client.user_id
            if not mine and (m.get("mention_all") or me in (m.get("mentions") or [])):
                self.console.print(
                    f"{where}[dim]{when} #{m['seq']}[/] [reverse bold yellow]@me[/] "
                    f"{who}: [bold yellow]{text}[/]{tail}"
                )
            else:
                self.console.print(f"{where}[dim]{when} #{m['seq']}[/] {who}: {text}{tail}")

    async def quote(self, conv_id: str, seq: int, seen: Mapping[int, JsonObject]) -> str:
        """``<sender>: <snippet>`` of a replied-to message: one this client holds, else a
        one-seq history fetch; "message unavailable" when I cannot see it."""
        orig: Mapping[str, Any] | None = self.device.messages.get(conv_id, {}).get(seq)
        if orig is None:
            orig = seen.get(seq)
        if orig is None:
            try:
                page = await self.client.history(conv_id, begin=seq, end=seq, limit=1)
            except ApiError:  # not a member any more, or no such conversation
                page = {}
            orig = next((x for x in page.get("messages") or [] if x.get("seq") == seq), None)
        if orig is None:
            return "message unavailable"
        return f"{self.who(int(orig['sender_id']))}: {escape(snippet(body(orig)))}"

    async def show_presence(self, frame: Mapping[str, Any]) -> None:
        user = self.who(int(frame.get("user_id") or 0))
        now = time.strftime("%H:%M")
        said = "is online" if frame.get("online") else "went offline"
        self.console.print(f"[dim]{now} ·[/] {user} {said}")

    # -- what is typed ---------------------------------------------------------------
    async def send(self, text: str, reply_to: int | None = None) -> None:
        """Send text to the open conversation; ``@`` words become mentions in a group
        (a single chat takes none: the server would refuse the send)."""
        if self.conv is None:
            self.console.print(NO_CONV)
            return
        if self.device.conn is None:
            return
        mentions, everyone = parse_mentions(text) if self.conv.startswith("g:") else ([], False)
        ack = await self.device.conn.send(
            self.conv,
            text,
            mentions=mentions or None,
            mention_all=everyone,
            reply_to=reply_to,
        )
        if not ack.get("ok"):
            self.console.print(
                f"[red]not sent: {escape(str(ack.get('code')))} "
                f"{escape(str(ack.get('message')))}[/]"
            )

    async def command(self, line: str) -> bool:
        parts = line.split()
        cmd, args = parts[0], parts[1:]
        c = self.client
        if cmd == "/quit":
            return False
        if cmd == "/me":
            self.console.print(await c.me())
        elif cmd == "/add" and args:
            self.console.print(
                await c.request(  # the full answer (it may say "accepted")
                    "POST", "/v1/friends/requests", json={"to_user_id": int(args[0])}
                )
            )
        elif cmd == "/requests":
            self.console.print(await c.friend_requests())
        elif cmd == "/accept" and args:
            self.console.print({"conv_id": await c.accept_friend(int(args[0]))})
        elif cmd == "/friends":
            for f in await c.friends():
                self.names[f["user_id"]] = f["username"]
                self.console.print(f"{f['user_id']:>6}  {escape(f['username']):<20} {f['conv_id']}")
        elif cmd == "/online":
            await self.online()
        elif cmd == "/list":
            await self.show_list()
        elif cmd == "/open" and args:
            target = args[0]
            if target.isdigit():
                a, b = sorted((int(target), c.user_id or 0))
                target = f"s:{a}:{b}"
            self.conv = target
            self.console.print(f"[bold]now in {escape(target)}[/]")
            await self.show_history(10)
        elif cmd == "/bot" and args:  # a chat with a bot needs no friend request
            conv = await c.request("POST", f"/v1/bots/{int(args[0])}/chat")
            self.conv = str(conv["conv_id"])
            self.console.print(f"[bold]now in {escape(self.conv)}[/]")
        elif cmd == "/history":
            await self.show_history(int(args[0]) if args else 20)
        elif cmd == "/group" and len(args) >= 1:
            g = await c.create_group(args[0], [int(x) for x in args[1:]])
            self.conv = g["conv_id"]
            self.console.print(f"[bold]created {g['conv_id']}[/]")
        elif cmd in ("/recall", "/reply", "/edit", "/react", "/unreact", "/file", "/save") and (
            self.conv is None
        ):
            self.console.print(NO_CONV)
        elif cmd in SETTINGS and not args:
            await self.setting(cmd)
        elif cmd == "/recall" and args and self.conv:
            self.console.print(await c.recall(self.conv, int(args[0])))
        elif cmd in ("/reply", "/edit") and len(words := line.split(maxsplit=2)) == 3:
            seq, text = int(words[1]), words[2]
            if cmd == "/reply":
                await self.send(text, reply_to=seq)
            elif self.conv is not None:  # the edit notice shows the change
                ans = await c.edit(self.conv, seq, text)
                if ans.get("edit_seq") is None:  # never edited, and the same text: no notice
                    self.console.print(f"[dim]#{seq} unchanged[/]")
        elif cmd == "/file" and args:
            await self.send_file(*split_path(line[len(cmd) :]))
        elif cmd == "/save" and 1 <= len(args) <= 2:
            await self.save(int(args[0]), Path(args[1] if len(args) == 2 else "."))
        elif cmd in ("/react", "/unreact") and len(args) == 2 and self.conv is not None:
            seq = int(args[0])  # the reaction notice shows the change
            if cmd == "/react":
                await c.react(self.conv, seq, args[1])
            else:
                await c.unreact(self.conv, seq, args[1])
        else:
            self.console.print(escape(HELP))
        return True

    async def send_file(self, path: str, caption: str) -> None:
        """Upload a file straight to the object store (with a progress bar) and send it
        to the open conversation: as a picture when its type is one, else as a file."""
        if self.conv is None or self.device.conn is None:
            return
        found = await asyncio.to_thread(local_file, path)
        if found is None:
            self.console.print(f"[red]no such file: {escape(path)}[/]")
            return
        file, size = found
        mime = (mimetypes.guess_type(file.name)[0] or "application/octet-stream").lower()
        with upload_bar(self.console) as bar:
            task = bar.add_task(escape(file.name), total=size)
            upload_id = await self.client.upload_file(
                file, mime, on_progress=lambda sent, _: bar.update(task, completed=sent)
            )
        content: dict[str, Any] = {"upload_id": upload_id}
        if caption:
            content["caption"] = caption
        kind = "image" if mime in PICTURE_TYPES else "file"
        ack = await self.device.conn.send(self.conv, content, kind)
        if not ack.get("ok") and kind == "image" and ack.get("code") == "bad_request":
            # named like a picture but not one the server can read: it still goes as a file
            kind = "file"
            ack = await self.device.conn.send(self.conv, content, kind)
        if not ack.get("ok"):
            self.console.print(
                f"[red]not sent: {escape(str(ack.get('code')))} "
                f"{escape(str(ack.get('message')))}[/]"
            )
            return
        # the ack is all this device hears of its own send: say what went
        what = attachment(kind, {"name": file.name, "size": size, "caption": caption})
        self.console.print(f"[dim]#{ack.get('seq')} sent:[/] {escape(what)}")

    async def save(self, seq: int, folder: Path) -> None:
        """Download the picture or file of message ``seq`` of the open conversation into
        ``folder``, under the name it was sent with (never replacing a file)."""
        if self.conv is None:
            return
        m: Mapping[str, Any] | None = self.device.messages.get(self.conv, {}).get(seq)
        if m is None:
            page = await self.client.history(self.conv, begin=seq, end=seq, limit=1)
            m = next((x for x in page.get("messages") or [] if x.get("seq") == seq), None)
        c = m.get("content") if m is not None else None
        if m is not None and m.get("recalled"):
            self.console.print(f"[red]#{seq} was recalled[/]")
            return
        if m is None or m.get("content_type") not in ATTACHMENTS or not isinstance(c, dict):
            self.console.print(f"[red]#{seq} is no picture or file here[/]")
            return
        data = await self.client.download(str(c["upload_id"]))
        target = await asyncio.to_thread(save_new, folder, str(c.get("name") or ""), data)
        self.console.print(f"[dim]#{seq} saved to[/] {escape(str(target))}")

    async def setting(self, cmd: str) -> None:
        """/mute, /unmute, /pin, /unpin on the open conversation; the confirmation says
        what the server answered."""
        if self.conv is None:
            self.console.print(NO_CONV)
            return
        field, value = SETTINGS[cmd]
        ans = await self.client.conversation_settings(self.conv, **{field: value})
        word = field if ans.get(field) else "un" + field
        self.console.print(f"[dim]{escape(self.conv)} {word}[/]")

    async def show_list(self) -> None:
        """My conversations in the server's order (pinned first), under a header with
        the badge: unread counts of those not muted, plus mentions in muted ones."""
        states, unread = await self.client.conversations(), await self.client.unread()
        header = f"[bold]conversations · badge {unread['badge']}[/]"
        if unread["total"] != unread["badge"]:
            header += f" [dim]({unread['total']} unread, muted ones included)[/]"
        self.console.print(header)
        for s in states:
            self.console.print(list_line(s, s.get("name") or self.name(s.get("peer_id") or 0)))

    async def online(self) -> None:
        """Each friend: online, last seen when, or hidden (they removed me, a block)."""
        friends = await self.client.friends()
        for f in friends:
            self.names[f["user_id"]] = f["username"]
        if not friends:
            self.console.print("no friends yet: /add <user_id>")
        ids = [int(f["user_id"]) for f in friends]
        for i in range(0, len(ids), 200):  # the server takes 200 ids a call
            for p in await self.client.presence(ids[i : i + 200]):
                if p.get("online"):
                    state = "[green]online[/]"
                elif p.get("online") is None:
                    state = "[dim]presence not shown[/]"
                elif p.get("last_seen"):
                    state = f"last seen {clock(int(p['last_seen']))}"
                else:
                    state = "offline"
                uid = int(p["user_id"])
                self.console.print(f"{uid:>6}  {escape(self.name(uid)):<20} {state}")

    async def show_history(self, n: int) -> None:
        if not self.conv:
            return
        page = await self.client.history(self.conv, limit=n, order="desc")
        msgs: list[JsonObject] = list(reversed(page["messages"]))
        seen = {int(m["seq"]): m for m in msgs}
        for m in msgs:
            self.queue.put_nowait(partial(self.show, m, seen))
        others = [m for m in msgs if m["sender_id"] != self.client.user_id]
        if others:  # one read report covers the page
            self.mark_read(others[-1])
        await self.queue.join()

    async def run(self) -> None:
        for f in await self.client.friends():  # names first: the snapshot shows them
            self.names[f["user_id"]] = f["username"]
        printer = asyncio.create_task(self.printer())
        await self.device.start()
        if self.device.conn is not None:  # after the sync: /online tells what came before
            self.device.conn.on_event(self.on_event)
        me = await self.client.me()
        await self.queue.join()
        self.console.print(
            f"[bold]signed in as {escape(me['username'])} (user id {me['user_id']}).[/] "
            "/help for commands"
        )
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not await self.command(line):
                        break
                else:
                    await self.send(line)
            except ApiError as e:
                self.console.print(f"[red]{e.status} {escape(e.code)}: {escape(e.message)}[/]")
            except (ValueError, IndexError):
                self.console.print(escape(HELP))
            except (ConnectionLost, TimeoutError, TransportError) as e:
                self.console.print(f"[red]server unreachable: {escape(str(e))}[/]")
        await self.device.aclose()
        printer.cancel()
