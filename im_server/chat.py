"""``im-server chat``: a small terminal chat on the Python client, to try a server
from a shell. Lines you type are sent to the open conversation; commands start with /.

    im-server chat --url http://127.0.0.1:8000 --user alice --password 'secret pw' [--register]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from rich.console import Console

from im_server.client import ApiError, Client, Device

HELP = """commands:
  /me                      who am I (give your user id to friends)
  /add <user_id>           send a friend request (accepts theirs if they asked first)
  /requests                pending friend requests
  /accept <request_id>     accept a request
  /friends                 your friends
  /list                    your conversations, with unread counts
  /open <conv_id|user_id>  chat in a conversation (a user id opens your single chat)
  /history [n]             the last n messages of the open conversation (default 20)
  /group <name> <ids...>   create a group with these members
  /recall <seq>            recall your message
  /quit                    leave
anything else is sent to the open conversation"""


class Chat:
    def __init__(self, client: Client, console: Console) -> None:
        self.client = client
        self.console = console
        self.conv: str | None = None
        self.names: dict[int, str] = {}
        self.device = Device(client, on_message=self.on_message, queue_events=False)

    def name(self, user_id: int) -> str:
        return self.names.get(user_id, f"user {user_id}")

    def on_message(self, m: dict[str, Any]) -> None:
        when = time.strftime("%H:%M", time.localtime(m["server_time"] / 1000))
        mine = m["sender_id"] == self.client.user_id
        where = "" if m["conv_id"] == self.conv else f"[dim]{m['conv_id']}[/] "
        if m["content_type"] == "system":
            c = m["content"] or {}
            self.console.print(
                f"{where}[dim]{when} · {c.get('event', 'system')} {c.get('user_ids', '')}[/]"
            )
        elif m["content_type"] == "recall":
            self.console.print(
                f"{where}[dim]{when} · message {m['content'].get('seq')} was recalled[/]"
            )
        else:
            text = (
                (m["content"] or {}).get("text", m["content"])
                if not m["recalled"]
                else "(recalled)"
            )
            who = "[bold green]me[/]" if mine else f"[bold cyan]{self.name(m['sender_id'])}[/]"
            self.console.print(f"{where}[dim]{when} #{m['seq']}[/] {who}: {text}")
        if not mine and m["conv_id"] == self.conv and self.device.conn is not None:
            asyncio.get_running_loop().create_task(self.device.conn.read(m["conv_id"], m["seq"]))

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
                self.console.print(f"{f['user_id']:>6}  {f['username']:<20} {f['conv_id']}")
        elif cmd == "/list":
            for s in await c.conversations():
                label = s.get("name") or self.name(s.get("peer_id") or 0)
                self.console.print(f"{s['conv_id']:<22} {label:<20} unread {s['unread']}")
        elif cmd == "/open" and args:
            target = args[0]
            if target.isdigit():
                a, b = sorted((int(target), c.user_id or 0))
                target = f"s:{a}:{b}"
            self.conv = target
            self.console.print(f"[bold]now in {target}[/]")
            await self.show_history(10)
        elif cmd == "/history":
            await self.show_history(int(args[0]) if args else 20)
        elif cmd == "/group" and len(args) >= 1:
            g = await c.create_group(args[0], [int(x) for x in args[1:]])
            self.conv = g["conv_id"]
            self.console.print(f"[bold]created {g['conv_id']}[/]")
        elif cmd == "/recall" and args and self.conv:
            self.console.print(await c.recall(self.conv, int(args[0])))
        else:
            self.console.print(HELP)
        return True

    async def show_history(self, n: int) -> None:
        if not self.conv:
            return
        page = await self.client.history(self.conv, limit=n, order="desc")
        for m in reversed(page["messages"]):
            self.on_message(m)

    async def run(self) -> None:
        await self.device.start()
        for f in await self.client.friends():
            self.names[f["user_id"]] = f["username"]
        me = await self.client.me()
        self.console.print(
            f"[bold]signed in as {me['username']} (user id {me['user_id']}).[/] /help for commands"
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
                elif self.conv is None:
                    self.console.print("open a conversation first: /open <conv_id|user_id>")
                elif self.device.conn is not None:
                    ack = await self.device.conn.send(self.conv, line)
                    if not ack.get("ok"):
                        self.console.print(
                            f"[red]not sent: {ack.get('code')} {ack.get('message')}[/]"
                        )
            except ApiError as e:
                self.console.print(f"[red]{e.status} {e.code}: {e.message}[/]")
            except (ValueError, IndexError):
                self.console.print(HELP)
        await self.device.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="im-server chat", description="a terminal chat client")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--register", action="store_true", help="create the account first")
    args = p.parse_args(argv)
    console = Console(highlight=False)

    async def go() -> None:
        if args.register:
            client = await Client.register(args.url, args.user, args.password)
        else:
            client = await Client.login(args.url, args.user, args.password)
        try:
            await Chat(client, console).run()
        finally:
            await client.aclose()

    try:
        asyncio.run(go())
    except ApiError as e:
        console.print(f"[red]{e.status} {e.code}: {e.message}[/]")
        return 1
    except KeyboardInterrupt:
        pass
    return 0
