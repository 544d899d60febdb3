"""Webhooks (PROTOCOL.md "Webhooks"): registered through the server API, written in the
commit of what they describe, signed the Standard Webhooks way, delivered at least once
and in order per conversation, retried while the receiver is down, failed and retried
by hand, rotated, kill -9 of the delivering process. The receiver runs in the test;
the servers here have stores of their own (another server's deliverer would take these
deliveries) and may call private addresses."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from im_server.client import ApiError, Client, ServerClient
from im_server.client.transport import request_sync
from im_server.runtime.processes import free_port
from tests.support import ServerProcess, Stores, api_key, eventually, metric

HOOK_ENV = {
    "IM_WEBHOOK_ALLOW_PRIVATE": "true",
    "IM_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    "IM_WEBHOOK_RETRY_HOURS": "0.002",  # 7.2 s, then failed
    "IM_WEBHOOK_POLL_SECONDS": "0.1",
    "IM_WEBHOOK_TIMEOUT_SECONDS": "1",
}


@dataclass
class Received:
    msg_id: str
    timestamp: str
    signatures: list[str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        out: dict[str, Any] = orjson.loads(self.body)
        return out


@dataclass
class Receiver:
    """An HTTP receiver whose answer the test sets: 204, an error status, or a hang."""

    url: str = ""
    got: list[Received] = field(default_factory=list)
    status: int = 204
    hang: float = 0.0
    calls: int = 0

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.got if type_ is None or r.event["type"] == type_]


@pytest.fixture(scope="module")
def hook_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("hook-stores"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hook_server(hook_stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**hook_stores.env(), **HOOK_ENV}).start()
    yield srv
    srv.terminate()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()

    async def handle(request: web.Request) -> web.Response:
        rec.calls += 1
        body = await request.read()
        if rec.hang:
            await asyncio.sleep(rec.hang)
        if rec.status < 300:
            rec.got.append(
                Received(
                    request.headers["webhook-id"],
                    request.headers["webhook-timestamp"],
                    request.headers["webhook-signature"].split(" "),
                    body,
                )
            )
        return web.Response(status=rec.status)

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rec.url = f"http://127.0.0.1:{port}/hook"
    yield rec
    await runner.cleanup()


@pytest.fixture
async def app(hook_server: ServerProcess, hook_stores: Stores) -> AsyncIterator[ServerClient]:
    async with ServerClient(hook_server.url, await api_key(hook_stores)) as c:
        yield c


async def register(app: ServerClient, url: str, events: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = await app.request(
        "POST", "/v1/server/webhooks", json={"url": url, "events": events}
    )
    return out


def spec_verify(secret: str, r: Received) -> bool:
    """The Standard Webhooks check, written from the spec (not the server's code)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{r.msg_id}.{r.timestamp}.".encode() + r.body
    want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(want, s) for s in r.signatures)


def ext() -> str:
    return f"wh-{uuid.uuid4().hex[:10]}"


async def pair(app: ServerClient, url: str) -> tuple[Client, Client, str]:
    a, b = ext(), ext()
    await app.import_users([{"external_id": a}, {"external_id": b}])
    conv = await app.befriend(a, b)
    ca = Client(url, (await app.mint_token(a))["token"])
    cb = Client(url, (await app.mint_token(b))["token"])
    await ca.me()
    await cb.me()
    return ca, cb, conv


async def test_registration_list_rotation_and_deletion(
    app: ServerClient, receiver: Receiver
) -> None:
    made = await register(app, receiver.url, ["user.created"])
    assert made["secret"].startswith("whsec_")
    assert len(base64.b64decode(made["secret"][6:])) == 32
    listed = await app.request("GET", "/v1/server/webhooks")
    mine = [w for w in listed if w["webhook_id"] == made["webhook_id"]]
    assert mine and mine[0]["events"] == ["user.created"] and "secret" not in mine[0]
    for bad in (
        {"url": receiver.url, "events": []},
        {"url": receiver.url, "events": ["message.nope"]},
        {"url": "ftp://x/", "events": ["*"]},
        {"url": "http://u:p@127.0.0.1/", "events": ["*"]},
    ):
        with pytest.raises(ApiError) as err:
            await app.request("POST", "/v1/server/webhooks", json=bad)
        assert err.value.status in (400, 422)
    new = (await app.request("POST", f"/v1/server/webhooks/{made['webhook_id']}/rotate-secret"))[
        "secret"
    ]
    assert new != made["secret"]
    e = ext()
    await app.put_user(e)
    await eventually(lambda: any(r.event["data"].get("external_id") == e for r in receiver.got))
    got = next(r for r in receiver.got if r.event["data"].get("external_id") == e)
    assert len(got.signatures) == 2  # both secrets sign for a day
    assert spec_verify(new, got) and spec_verify(made["secret"], got)
    await app.request("DELETE", f"/v1/server/webhooks/{made['webhook_id']}")
    with pytest.raises(ApiError) as err:
        await app.request("DELETE", f"/v1/server/webhooks/{made['webhook_id']}")
    assert err.value.status == 404


async def test_events_of_messages_members_and_users(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    hook = await register(app, receiver.url, ["*"])
    only_users = await register(app, receiver.url + "?users", ["user.created", "user.deleted"])
    ca, cb, conv = await pair(app, hook_server.url)
    async with ca, cb:
        ack = await ca.send_rest(conv, {"text": "hello"})
        await ca.edit(conv, ack["seq"], {"text": "hello, edited"})
        second = await ca.send_rest(conv, {"text": "to recall"})
        await ca.recall(conv, second["seq"])
        owner = ext()
        await app.put_user(owner)
        g = await app.create_group("team", owner, [])
        bext = (await cb.me())["username"][1:]
        await app.add_member(g["group_id"], bext)
        await app.remove_member(g["group_id"], bext)

        def seen() -> bool:
            kinds = {
                e["type"]
                for e in receiver.events()
                if e["data"].get("conv_id") in (conv, g["conv_id"])
            }
            return kinds >= {
                "message.created",
                "message.edited",
                "message.recalled",
                "member.added",
                "member.removed",
            }

        await eventually(seen, timeout=20)
    created = [e for e in receiver.events("message.created") if e["data"]["conv_id"] == conv]
    first = next(e for e in created if e["data"]["seq"] == ack["seq"])
    assert first["data"]["content"] == {"text": "hello"}
    assert first["data"]["sender_id"] == ca.user_id
    assert first["data"]["external_id"]  # an app user: its external id rides along
    assert isinstance(first["timestamp"], int)
    for r in receiver.got:
        assert spec_verify(hook["secret"], r) or spec_verify(only_users["secret"], r)
    # the users-only webhook got user events and nothing else
    await eventually(lambda: any(r for r in receiver.got if r.event["type"] == "user.created"))
    await app.delete_user(owner)
    await eventually(lambda: receiver.events("user.deleted"))
    deleted = receiver.events("user.deleted")[0]["data"]
    assert deleted["external_id"] == owner


async def test_a_new_groups_first_members_are_one_member_added_before_the_next(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    """A group is made without a notice, so its first members (owner included) come as
    one ``member.added`` of their own, signed, keyed by the group, queued before the
    group's later events; the group's seq stream is untouched (its first notice is 1)."""
    hook = await register(app, receiver.url, ["member.added"])
    quiet = await register(app, receiver.url + "?messages", ["message.created"])
    owner, a, b, c = ext(), ext(), ext(), ext()
    made = await app.import_users([{"external_id": x} for x in (owner, a, b, c)])
    uid = {u["external_id"]: u["user_id"] for u in made}
    g = await app.create_group("first members", owner, [a, b])
    await app.add_member(g["group_id"], c)

    def of_group() -> list[Received]:
        return [r for r in receiver.got if r.event["data"].get("conv_id") == g["conv_id"]]

    await eventually(lambda: len(of_group()) == 2, timeout=20)
    first, then = of_group()
    assert first.msg_id == f"group_{g['conv_id']}_created"
    assert spec_verify(hook["secret"], first) and not spec_verify(quiet["secret"], first)
    assert first.event["type"] == "member.added"
    data = first.event["data"]
    assert data["content"] == {
        "event": "members_added",
        "actor": uid[owner],
        "user_ids": sorted([uid[owner], uid[a], uid[b]]),
        "with_history": True,
    }
    assert data["sender_id"] == uid[owner] and data["external_id"] == owner
    assert data["content_type"] == "system" and "seq" not in data
    # every other field of a notice's event, so a receiver reads both alike
    assert set(then.event["data"]) - {"seq"} == set(data), (then.event["data"], data)
    assert then.event["type"] == "member.added"
    assert then.event["data"]["seq"] == 1  # the group's first notice: creation took none
    assert then.event["data"]["content"]["user_ids"] == [uid[c]]
    await asyncio.sleep(0.5)  # nothing else of the group, and nothing for the other hook
    assert len(of_group()) == 2


async def test_order_per_conversation_under_concurrent_sends(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    hook = await register(app, receiver.url, ["message.created"])
    convs = [await pair(app, hook_server.url) for _ in range(3)]
    sent: dict[str, list[int]] = {}

    async def burst(ca: Client, cb: Client, conv: str) -> None:
        acks = await asyncio.gather(
            *(c.send_rest(conv, {"text": f"m{i}"}) for i in range(15) for c in (ca, cb))
        )
        sent[conv] = sorted(int(a["seq"]) for a in acks)

    await asyncio.gather(*(burst(*p) for p in convs))

    def complete() -> bool:
        return all(
            sorted({e["data"]["seq"] for e in receiver.events() if e["data"]["conv_id"] == c})
            == sent[c]
            for _, _, c in convs
        )

    await eventually(complete, timeout=30)
    for _, _, conv in convs:
        seqs = [e["data"]["seq"] for e in receiver.events() if e["data"]["conv_id"] == conv]
        assert seqs == sorted(seqs), "delivered out of order"
        assert len(seqs) == len(set(seqs)) == 30
    ids = [r.msg_id for r in receiver.got]
    assert len(ids) == len(set(ids))
    assert all(spec_verify(hook["secret"], r) for r in receiver.got)
    wid = hook["webhook_id"]
    # what /metrics says of it: deliveries, their lag, its queue (every 10 s)
    sample = f'im_webhook_deliveries_total{{outcome="delivered",webhook="{wid}"}}'
    assert metric(hook_server.url, sample) >= 90
    lag = f'im_webhook_delivery_lag_seconds_count{{webhook="{wid}"}}'
    assert metric(hook_server.url, lag) >= 90
    await eventually(
        lambda: (
            metric(hook_server.url, f'im_webhook_queue_depth{{webhook="{wid}"}}') == 0
            and f'webhook="{wid}"' in request_sync("GET", hook_server.url + "/metrics").text
        ),
        timeout=15,
    )
    for ca, cb, _ in convs:
        await ca.aclose()
        await cb.aclose()


async def test_a_receiver_down_for_a_while_gets_everything_after(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    await register(app, receiver.url, ["message.created"])
    ca, cb, conv = await pair(app, hook_server.url)
    receiver.status = 503
    acks = [await ca.send_rest(conv, {"text": f"while down {i}"}) for i in range(5)]
    await eventually(lambda: receiver.calls >= 3, timeout=10)  # retried
    assert receiver.got == []
    pending = await app.request(
        "GET",
        f"/v1/server/webhooks/{(await app.request('GET', '/v1/server/webhooks'))[-1]['webhook_id']}/deliveries?status=pending",
    )
    assert pending["deliveries"] and pending["deliveries"][-1]["attempts"] >= 1
    receiver.status = 204
    want = [a["seq"] for a in acks]
    await eventually(
        lambda: (
            [e["data"]["seq"] for e in receiver.events() if e["data"]["conv_id"] == conv] == want
        ),
        timeout=20,
    )
    await ca.aclose()
    await cb.aclose()


async def test_failed_after_the_window_then_retried_by_hand(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    hook = await register(app, receiver.url, ["user.created"])
    wid = hook["webhook_id"]
    receiver.status = 500
    e = ext()
    await app.put_user(e)

    async def failed() -> list[dict[str, Any]]:
        got = await app.request("GET", f"/v1/server/webhooks/{wid}/deliveries?status=failed")
        return [d for d in got["deliveries"] if d["type"] == "user.created"]

    rows = await eventually(failed, timeout=30)
    assert rows[0]["last_error"] == "HTTP 500" and rows[0]["attempts"] >= 2
    receiver.status = 204
    await app.request("POST", f"/v1/server/webhooks/{wid}/deliveries/{rows[0]['event_id']}/retry")
    await eventually(lambda: any(r.msg_id == rows[0]["event_id"] for r in receiver.got))
    with pytest.raises(ApiError) as err:  # not failed any more
        await app.request(
            "POST", f"/v1/server/webhooks/{wid}/deliveries/{rows[0]['event_id']}/retry"
        )
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        await app.request("GET", f"/v1/server/webhooks/{wid}/deliveries?status=lost")
    assert err.value.status == 400


async def test_a_slow_receiver_slows_no_other(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    await register(app, receiver.url + "?fast", ["message.created"])
    # a receiver that never answers in time (a closed port answers at once; this hangs)
    hang_server = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
    port = hang_server.sockets[0].getsockname()[1]
    try:
        await register(app, f"http://127.0.0.1:{port}/hook", ["message.created"])
        ca, cb, conv = await pair(app, hook_server.url)
        t0 = time.perf_counter()
        acks = [await ca.send_rest(conv, {"text": f"m{i}"}) for i in range(10)]
        send_s = time.perf_counter() - t0
        want = [a["seq"] for a in acks]
        await eventually(
            lambda: (
                [e["data"]["seq"] for e in receiver.events() if e["data"]["conv_id"] == conv]
                == want
            ),
            timeout=10,
        )
        assert send_s < 5, send_s  # sends never waited for either receiver
        await ca.aclose()
        await cb.aclose()
    finally:
        hang_server.close()


async def test_kill_9_of_the_delivering_process(hook_stores: Stores, receiver: Receiver) -> None:
    """Deliveries claimed by a process that dies are delivered by another, at least once
    and in order per conversation."""
    srv = ServerProcess(env={**hook_stores.env(), **HOOK_ENV}).start()
    other: ServerProcess | None = None
    try:
        async with ServerClient(srv.url, await api_key(hook_stores)) as app:
            await register(app, receiver.url + "?kill", ["message.created"])
            ca, cb, conv = await pair(app, srv.url)
            receiver.hang = 0.5  # deliveries in flight when the process dies
            acks = [await ca.send_rest(conv, {"text": f"k{i}"}) for i in range(8)]
            await eventually(lambda: receiver.calls >= 1, timeout=10)
            srv.kill9()
            receiver.hang = 0.0
            other = ServerProcess(env={**hook_stores.env(), **HOOK_ENV}).start()
            want = [a["seq"] for a in acks]

            def firsts() -> list[int]:
                seen: list[int] = []
                for e in receiver.events():
                    if e["data"]["conv_id"] == conv and e["data"]["seq"] not in seen:
                        seen.append(e["data"]["seq"])
                return seen

            await eventually(lambda: firsts() == want, timeout=30)
            await ca.aclose()
            await cb.aclose()
    finally:
        srv.terminate()
        if other is not None:
            other.terminate()


async def test_bot_bound_messages_name_the_bot(
    hook_server: ServerProcess, app: ServerClient, receiver: Receiver
) -> None:
    await register(app, receiver.url + "?bots", ["message.created"])
    bot = ext()
    made = await app.put_user(bot, kind="bot")
    u = ext()
    await app.put_user(u)
    c = Client(hook_server.url, (await app.mint_token(u))["token"])
    await c.me()
    async with c:
        conv = (await c.request("POST", f"/v1/bots/{made['user_id']}/chat"))["conv_id"]
        ack = await c.send_rest(conv, {"text": "hi bot"})
        g = await c.request(
            "POST", "/v1/groups", json={"name": "g", "member_ids": [made["user_id"]]}
        )
        plain = await c.send_rest(g["conv_id"], {"text": "no mention"})
        mention = await c.send_rest(g["conv_id"], {"text": "@bot"}, mentions=[made["user_id"]])

        def by_seq(cv: str, seq: int) -> dict[str, Any] | None:
            return next(
                (
                    e["data"]
                    for e in receiver.events()
                    if e["data"]["conv_id"] == cv and e["data"]["seq"] == seq
                ),
                None,
            )

        await eventually(lambda: by_seq(g["conv_id"], mention["seq"]), timeout=15)
        assert by_seq(conv, ack["seq"])["to_bots"] == [made["user_id"]]  # type: ignore[index]
        assert by_seq(g["conv_id"], mention["seq"])["to_bots"] == [made["user_id"]]  # type: ignore[index]
        assert "to_bots" not in by_seq(g["conv_id"], plain["seq"])  # type: ignore[operator]


async def test_private_addresses_are_refused_by_default(url: str, stores: Stores) -> None:
    async with ServerClient(url, await api_key(stores, ["webhooks"])) as app:
        for target in (
            "http://127.0.0.1:9/x",
            "http://localhost:9/x",
            "http://10.0.0.1/x",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://0.0.0.0/x",
        ):
            with pytest.raises(ApiError) as err:
                await register(app, target, ["*"])
            assert err.value.status == 400, target
        assert await app.request("GET", "/v1/server/webhooks") == [] or all(
            "127.0.0.1" not in w["url"] for w in await app.request("GET", "/v1/server/webhooks")
        )


EXAMPLE_BOT = Path(__file__).resolve().parents[2] / "examples" / "echo_bot.py"


async def test_the_example_echo_bot(hook_server: ServerProcess, hook_stores: Stores) -> None:
    """``examples/echo_bot.py`` as the README runs it, next to a server."""
    env = {**os.environ, "IM_API_KEY": await api_key(hook_stores)}
    bot = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE_BOT),
        "--url",
        hook_server.url,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--bot",
        ext(),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert bot.stdout is not None
        line = (await asyncio.wait_for(bot.stdout.readline(), 60)).decode()
        assert line.startswith("bot user id "), line
        bot_id = int(line.split()[3].rstrip(";"))
        user = Client(hook_server.url)
        async with ServerClient(hook_server.url, env["IM_API_KEY"]) as app:
            u = ext()
            await app.put_user(u)
            user.token = (await app.mint_token(u))["token"]
        async with user:
            await user.me()
            conv = (await user.request("POST", f"/v1/bots/{bot_id}/chat"))["conv_id"]
            sock = await user.connect()
            hello = await user.send_rest(conv, {"text": "hello"})
            got = await sock.next_event(
                "message", timeout=20, predicate=lambda f: f["message"]["sender_id"] == bot_id
            )
            assert got["message"]["content"] == {"text": "echo: hello"}
            assert got["message"]["reply_to"] == hello["seq"]
            await user.send_rest(conv, {"text": "buy spam now"})
            got = await sock.next_event(
                "message", timeout=20, predicate=lambda f: f["message"]["sender_id"] == bot_id
            )
            assert got["message"]["content"] == {"text": "please keep it clean"}
    finally:
        bot.terminate()
        await bot.wait()
