"""The webhooks scenario: kill -9 of a delivering process while events flow.

``./scripts/bench chaos --scenarios webhooks``. Two server processes share the stores
(each persists, each delivers webhooks). A receiver in this process takes every
delivery after a short random delay (so deliveries are in flight), and records the
webhook-id and the message of each. ``--senders`` users send to their own single chats
through the process that is not killed, one send at a time; after ``pre`` seconds the
other process is killed with SIGKILL, and started again; ``post`` more seconds of load;
then the scenario waits until every acked message's event arrived (or the settle
timeout).

Reported: sends acked; events received (distinct); missing (acked, never received);
duplicates (an event received more than once: allowed, at least once); order
violations (an event of a conversation arriving, for the first time, after a later
one of the same conversation had arrived: must be 0); the longest wait for an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from im_server.bench.cluster import ServerProcess, Stores
from im_server.bench.common import make_api_key
from im_server.client import Client, ServerClient

HOOK_ENV = {
    "IM_WEBHOOK_ALLOW_PRIVATE": "true",
    "IM_WEBHOOK_POLL_SECONDS": "0.1",
    "IM_WEBHOOK_TIMEOUT_SECONDS": "1",
    "IM_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    "IM_LOG_LEVEL": "WARNING",
}


@dataclass
class Received:
    first: dict[tuple[str, int], float] = field(default_factory=dict)  # event -> arrival
    order: dict[str, list[int]] = field(default_factory=dict)  # conv -> seqs, first arrivals
    count: dict[str, int] = field(default_factory=dict)  # webhook-id -> deliveries
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


async def _receiver(rec: Received) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        await asyncio.sleep(random.uniform(0, 0.02))
        msg_id = request.headers["webhook-id"]
        rec.count[msg_id] = rec.count.get(msg_id, 0) + 1
        rec.arrived.set()
        data = orjson.loads(body)["data"]
        key = (data["conv_id"], int(data["seq"]))
        if key not in rec.first:
            rec.first[key] = time.monotonic()
            rec.order.setdefault(key[0], []).append(key[1])
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/events", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/events"


async def run(
    folder: Path,
    senders: int = 8,
    pre_s: float = 10.0,
    post_s: float = 5.0,
    settle_s: float = 60.0,
) -> dict[str, Any]:
    stores = Stores.start(folder / "stores")
    rec = Received()
    runner, url = await _receiver(rec)
    env = {**stores.env(), **HOOK_ENV, "IM_TEST_LOG_DIR": str(folder)}
    steady = ServerProcess(env=env).start()
    victim = ServerProcess(env=env).start()
    acked: dict[tuple[str, int], float] = {}
    try:
        key = await make_api_key(stores.pg.url, ["all"], "chaos")
        async with ServerClient(steady.url, key) as app:
            await app.create_webhook(url, ["message.created"])
            run_id = uuid.uuid4().hex[:6]
            ids = [f"c{run_id}-{i}" for i in range(2 * senders)]
            await app.import_users([{"external_id": x} for x in ids])
            pairs = []
            for i in range(senders):
                conv = await app.befriend(ids[2 * i], ids[2 * i + 1])
                c = Client(steady.url, (await app.mint_token(ids[2 * i]))["token"])
                await c.me()
                pairs.append((c, conv))
        stop = asyncio.Event()

        async def send_loop(c: Client, conv: str) -> None:
            sock = await c.connect()
            n = 0
            while not stop.is_set():
                ack = await sock.send(conv, {"text": f"m{n}"}, client_msg_id=f"x{n}")
                if ack.get("ok"):
                    acked.setdefault((conv, int(ack["seq"])), time.monotonic())
                    n += 1
            await c.aclose()

        tasks = [asyncio.create_task(send_loop(c, conv)) for c, conv in pairs]
        await asyncio.sleep(pre_s)
        t_kill = time.monotonic()
        victim.kill9()
        victim.start()
        restart_s = time.monotonic() - t_kill
        await asyncio.sleep(post_s)
        stop.set()
        await asyncio.gather(*tasks)
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and any(k not in rec.first for k in acked):
            rec.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rec.arrived.wait(), 0.5)
    finally:
        await runner.cleanup()
        steady.terminate()
        victim.terminate()
        stores.stop()
    missing = [k for k in acked if k not in rec.first]
    violations = sum(
        1 for seqs in rec.order.values() for a, b in zip(seqs, seqs[1:], strict=False) if b < a
    )
    waits = [rec.first[k] - t for k, t in acked.items() if k in rec.first]
    return {
        "senders": senders,
        "acked": len(acked),
        "received": len(rec.first),
        "missing": len(missing),
        "duplicates": sum(n - 1 for n in rec.count.values() if n > 1),
        "order_violations": violations,
        "restart_s": round(restart_s, 2),
        "max_event_wait_s": round(max(waits), 2) if waits else None,
    }


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="webhooks: kill -9 of a delivering process under load")
    for k in res:
        t.add_column(k)
    t.add_row(*(str(v) for v in res.values()))
    Console().print(t)
