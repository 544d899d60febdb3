"""The before-send hook (PROTOCOL.md "The before-send hook"): every decision (allow,
reject, replace), the failure policies (a timeout, an error, an answer that is not one),
the decision kept per (sender, client_msg_id) so a retry never asks twice, calls side
by side, the circuit breaker, and notices never shown to it. The hook runs in the test;
each server here is started with its URL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from im_server.client import ApiError, Client, ServerClient, single_conv_id
from tests.support import (
    ServerProcess,
    Stores,
    api_key,
    befriend,
    eventually,
    new_user,
    persisted,
)

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


@dataclass
class Hook:
    url: str = ""
    calls: Counter[str] = field(default_factory=Counter)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # frees "hold" answers
    bodies: list[dict[str, Any]] = field(default_factory=list)
    bad_signatures: int = 0


async def _hook_app(hook: Hook, hang_all: bool = False) -> web.AppRunner:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        key = base64.b64decode(SECRET[6:])
        signed = (
            f"{request.headers.get('webhook-id')}.{request.headers.get('webhook-timestamp')}."
        ).encode() + raw
        want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        if want not in request.headers.get("webhook-signature", "").split():
            hook.bad_signatures += 1
        body = orjson.loads(raw)
        hook.bodies.append(body)
        data = body["data"]
        hook.calls[data["client_msg_id"]] += 1
        if hang_all:
            await asyncio.sleep(5)
        text = str(data["content"].get("text", ""))
        if text.startswith("reject"):
            return web.json_response({"action": "reject", "reason": "not on this app"})
        if text.startswith("replace"):
            return web.json_response({"action": "replace", "content": {"text": "[removed]"}})
        if text.startswith("hold"):
            await hook.release.wait()
            return web.json_response({"action": "allow"})
        if text.startswith("slow"):
            await asyncio.sleep(float(text.split()[1]))
            return web.json_response({"action": "allow"})
        if text.startswith("error"):
            return web.Response(status=500)
        if text.startswith("garbage"):
            return web.Response(text="<html>not json</html>")
        if text.startswith("unknown"):
            return web.json_response({"action": "shrug"})
        return web.json_response({"action": "allow"})

    app = web.Application()
    app.router.add_post("/before-send", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    hook.url = f"http://127.0.0.1:{port}/before-send"
    return runner


@pytest.fixture(scope="module")
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    runner = await _hook_app(h)
    yield h
    await runner.cleanup()


@pytest.fixture(scope="module")
def hooked(stores: Stores, hook: Hook) -> Iterator[ServerProcess]:
    env = {
        **stores.env(),
        "IM_BEFORE_SEND_URL": hook.url,
        "IM_BEFORE_SEND_SECRET": SECRET,
        "IM_BEFORE_SEND_TIMEOUT_MS": "1000",
        "IM_BEFORE_SEND_BREAKER_FAILURES": "1000",  # the breaker has a test of its own
    }
    srv = ServerProcess(env=env).start()
    yield srv
    srv.terminate()


async def test_allow_reject_replace(hooked: ServerProcess, hook: Hook) -> None:
    a, b = await new_user(hooked.url), await new_user(hooked.url)
    conv = await befriend(a, b)
    sock = await b.connect()
    ok = await a.send_rest(conv, {"text": "hello"}, client_msg_id="allow-1")
    assert ok["ok"] is True
    asked = next(x for x in hook.bodies if x["data"]["client_msg_id"] == "allow-1")
    assert asked["type"] == "message.before_send" and isinstance(asked["timestamp"], int)
    assert asked["data"] == {
        "conv_id": conv,
        "sender_id": a.user_id,
        "client_msg_id": "allow-1",
        "content_type": "text",
        "content": {"text": "hello"},
    }
    assert hook.bad_signatures == 0
    # reject: over REST a 403 rejected with the hook's reason; over the socket the ack
    with pytest.raises(ApiError) as err:
        await a.send_rest(conv, {"text": "reject me"}, client_msg_id="rej-1")
    assert (err.value.status, err.value.code, err.value.message) == (
        403,
        "rejected",
        "not on this app",
    )
    ws = await a.connect()
    ack = await ws.send(conv, {"text": "reject this too"}, client_msg_id="rej-2")
    assert ack["ok"] is False and ack["code"] == "rejected"
    assert ack["message"] == "not on this app"
    # no seq was used: the next message is the very next seq
    nxt = await a.send_rest(conv, {"text": "fine"})
    assert nxt["seq"] == ok["seq"] + 1
    # replace: stored and delivered with the hook's content
    rep = await a.send_rest(conv, {"text": "replace this"}, client_msg_id="rep-1")
    got = await sock.next_event(
        "message", timeout=10, predicate=lambda f: f["message"]["seq"] == rep["seq"]
    )
    assert got["message"]["content"] == {"text": "[removed]"}
    await persisted(a, conv, rep["seq"])
    page = await a.history(conv)
    assert next(m for m in page["messages"] if m["seq"] == rep["seq"])["content"] == {
        "text": "[removed]"
    }


async def test_a_retry_gets_the_first_decision_without_asking(
    hooked: ServerProcess, hook: Hook
) -> None:
    a, b = await new_user(hooked.url), await new_user(hooked.url)
    conv = await befriend(a, b)
    for cmid, text in (("r-rej", "reject"), ("r-rep", "replace"), ("r-ok", "fine")):
        first: Any = None
        for _ in range(3):
            try:
                first = first or await a.send_rest(conv, {"text": text}, client_msg_id=cmid)
                again = await a.send_rest(conv, {"text": text}, client_msg_id=cmid)
                assert again["seq"] == first["seq"] and again["duplicate"] is True
            except ApiError as e:
                assert e.code == "rejected"
        assert hook.calls[cmid] == 1, cmid
    # a different content under the same client_msg_id gets the same decision too
    with pytest.raises(ApiError) as err:
        await a.send_rest(conv, {"text": "now innocent"}, client_msg_id="r-rej")
    assert err.value.code == "rejected"
    assert hook.calls["r-rej"] == 1


async def test_no_usable_answer_takes_the_failure_policy(hooked: ServerProcess, hook: Hook) -> None:
    a, b = await new_user(hooked.url), await new_user(hooked.url)
    conv = await befriend(a, b)
    for text in ("slow 3", "error", "garbage", "unknown action"):
        cmid = f"f-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        ack = await a.send_rest(conv, {"text": text}, client_msg_id=cmid)
        assert ack["ok"] is True, text  # IM_BEFORE_SEND_FAILURE=allow
        assert time.perf_counter() - t0 < 2.5, text  # bounded by the 1 s timeout
    # a failure is not kept: a retry asks again (and is a duplicate of the send)
    cmid = f"f-{uuid.uuid4().hex[:8]}"
    first = await a.send_rest(conv, {"text": "error"}, client_msg_id=cmid)
    again = await a.send_rest(conv, {"text": "error"}, client_msg_id=cmid)
    assert again["seq"] == first["seq"] and hook.calls[cmid] == 2


async def test_calls_run_side_by_side(hooked: ServerProcess, hook: Hook) -> None:
    """While the hook holds one user's send, another user's send is answered."""
    a, b, c = [await new_user(hooked.url) for _ in range(3)]
    await befriend(a, c)
    await befriend(b, c)
    held_ws, quick_ws = await a.connect(), await b.connect()
    hook.release.clear()
    held = asyncio.create_task(
        held_ws.send(single_conv_id(a.user_id, c.user_id), {"text": "hold"}, client_msg_id="held-1")
    )
    await eventually(lambda: hook.calls["held-1"] == 1)  # the held call is at the hook
    ack = await quick_ws.send(
        single_conv_id(b.user_id, c.user_id), {"text": "quick"}, client_msg_id="quick-1"
    )
    assert ack["ok"] is True
    assert not held.done()  # answered while the other call was still held
    hook.release.set()
    assert (await held)["ok"] is True


async def test_the_app_servers_sends_and_notices(
    hooked: ServerProcess, hook: Hook, stores: Stores
) -> None:
    async with ServerClient(hooked.url, await api_key(stores)) as app:
        x, y = f"bs-{uuid.uuid4().hex[:8]}", f"bs-{uuid.uuid4().hex[:8]}"
        await app.import_users([{"external_id": x}, {"external_id": y}])
        conv = await app.befriend(x, y)
        with pytest.raises(ApiError) as err:
            await app.send_message(x, conv, "srv-rej", {"text": "reject"})
        assert err.value.code == "rejected"
        await app.send_message(x, conv, "srv-ok", {"text": "hi"})
        asked = next(b for b in hook.bodies if b["data"]["client_msg_id"] == "srv-ok")
        assert asked["data"]["external_id"] == x
        before = len(hook.bodies)
        g = await app.create_group("g", x, [y])
        await app.remove_member(g["group_id"], y)  # a notice: never shown to the hook
        c = Client(hooked.url, (await app.mint_token(x))["token"])
        await c.me()
        async with c:
            await persisted(c, g["conv_id"], 1)
        assert len(hook.bodies) == before


async def test_a_dead_hook_costs_one_timeout_per_window(stores: Stores) -> None:
    dead = Hook()
    runner = await _hook_app(dead, hang_all=True)
    env = {
        **stores.env(),
        "IM_BEFORE_SEND_URL": dead.url,
        "IM_BEFORE_SEND_TIMEOUT_MS": "300",
        "IM_BEFORE_SEND_FAILURE": "reject",
        "IM_BEFORE_SEND_BREAKER_FAILURES": "2",
        "IM_BEFORE_SEND_BREAKER_SECONDS": "1.5",
    }
    srv = ServerProcess(env=env).start()
    try:
        a, b = await new_user(srv.url), await new_user(srv.url)
        conv = await befriend(a, b)
        took = []
        for i in range(8):
            t0 = time.perf_counter()
            with pytest.raises(ApiError) as err:
                await a.send_rest(conv, {"text": f"m{i}"})
            took.append(time.perf_counter() - t0)
            assert err.value.code == "unavailable"
        assert sum(dead.calls.values()) == 2  # then the circuit is open: no call
        assert all(t < 0.2 for t in took[2:]), took
        await asyncio.sleep(1.6)
        for i in range(3):  # the window passed: one trial call, failing: open again
            with pytest.raises(ApiError):
                await a.send_rest(conv, {"text": f"n{i}"})
        assert sum(dead.calls.values()) == 3
    finally:
        srv.terminate()
        await runner.cleanup()
