"""An echo bot with a keyword filter, on the server API (docs/server-api.md, docs/webhooks.md).

It makes itself a bot user, registers a webhook for ``message.created`` pointing at a
small HTTP server of its own, checks each delivery's signature, and answers every
message sent to it (a single chat with it, or a group message that mentions it) through
``POST /v1/server/messages``. The answer's ``client_msg_id`` is made from the message it
answers, so a delivery that comes twice (webhooks are at least once) is answered once.

    IM_WEBHOOK_ALLOW_PRIVATE=true ./scripts/serve          # terminal 1
    export IM_API_KEY=$(.venv/bin/im-server apikey create --name echo-bot --scope all)
    .venv/bin/python examples/echo_bot.py                  # terminal 2
    .venv/bin/im-server chat --user ann --password 'a long password' --register   # 3
      /bot <the user id the bot printed>
      hello
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import orjson
from aiohttp import web

from im_server.client import ServerClient
from im_server.protocol.webhook_signing import verify

BLOCKED_WORDS = {"spam", "scam"}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the im-server")
    ap.add_argument("--listen", default="127.0.0.1:8099", help="where deliveries come")
    ap.add_argument("--bot", default="echo-bot", help="the bot's external id")
    args = ap.parse_args()
    host, port = args.listen.rsplit(":", 1)
    app = ServerClient(args.url, os.environ["IM_API_KEY"])
    me = await app.put_user(args.bot, display_name="Echo", kind="bot")
    hook = await app.create_webhook(f"http://{args.listen}/events", ["message.created"])
    print(f"bot user id {me['user_id']}; webhook {hook['webhook_id']}", flush=True)

    async def events(request: web.Request) -> web.Response:
        body = await request.read()
        h = request.headers
        if not verify(
            hook["secret"],
            h["webhook-id"],
            h["webhook-timestamp"],
            h["webhook-signature"],
            body,
            int(time.time()),
        ):
            return web.Response(status=401)
        msg = orjson.loads(body)["data"]
        if me["user_id"] in msg.get("to_bots", []) and msg["sender_id"] != me["user_id"]:
            text = str(msg["content"].get("text", ""))
            words = set(text.lower().split())
            reply = "please keep it clean" if words & BLOCKED_WORDS else f"echo: {text}"
            await app.send_message(
                args.bot,
                msg["conv_id"],
                f"echo-{msg['seq']}-{msg['conv_id'].replace(':', '-')}",
                {"text": reply},
                reply_to=msg["seq"],
            )
        return web.Response(status=204)  # acknowledged: the next event of the chat comes

    server = web.Application()
    server.router.add_post("/events", events)
    runner = web.AppRunner(server)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    try:
        await asyncio.Event().wait()
    finally:
        await app.delete_webhook(hook["webhook_id"])
        await runner.cleanup()
        await app.aclose()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
