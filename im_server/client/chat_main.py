"""``im-server chat``: a small terminal chat on the Python client, to try a server from a
shell (the chat itself is ``chat.py``).

    im-server chat --url http://127.0.0.1:8000 --user alice --password 'secret pw' [--register]
    IM_TOKEN=<a token> im-server chat --url http://127.0.0.1:8000

With no ``--user``, the token in ``IM_TOKEN`` signs in: one your app's backend minted
or signed (docs/server-api.md). It is read from the environment, not the command line,
which other users of the machine can see.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from rich.console import Console
from rich.markup import escape

from im_server.client import ApiError, Client
from im_server.client.chat import Chat


def make_console() -> Console:
    """The terminal's console: no highlighting, and no emoji codes (a conversation id
    such as ``s:100:101`` holds one, ``:100:``)."""
    return Console(highlight=False, emoji=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="im-server chat", description="a terminal chat client")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--user", help="a username (else the token in IM_TOKEN)")
    p.add_argument("--password")
    p.add_argument("--register", action="store_true", help="create the account first")
    args = p.parse_args(argv)
    token = os.environ.get("IM_TOKEN", "")
    if args.user is None and not token:
        p.error("give --user and --password, or a token in IM_TOKEN")
    if args.user is not None and args.password is None:
        p.error("--user needs --password")
    console = make_console()

    async def go() -> None:
        if args.user is None:
            client = Client(args.url, token)
            await client.me()  # who the token speaks for
        elif args.register:
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
        console.print(f"[red]{e.status} {escape(e.code)}: {escape(e.message)}[/]")
        return 1
    except KeyboardInterrupt:
        pass
    return 0
