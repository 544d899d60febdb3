"""A before-send hook for the benchmark, in a process of its own: it answers ``allow``
after ``DELAY_MS``, or never answers (``hang``).

    python -m im_server.bench.hook_server PORT DELAY_MS|hang"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if mode == "hang":
            await asyncio.sleep(3600)
        await asyncio.sleep(int(mode) / 1000)
        return web.json_response({"action": "allow"})

    app = web.Application()
    app.router.add_post("/hook", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
