"""The WebSocket gateway's receive loop against a fake ASGI receive/send pair (I/O
plumbing only: no store is reached). What it must do with what the ASGI server hands it:
pass frames to the session and carry out its answers, end quietly when the client went
away, and treat anything else as a bug: logged with its traceback, counted, socket
closed with 1011."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from im_server.app import build_context
from im_server.config import Settings
from im_server.gateway import ws
from im_server.gateway.fanout import Fanout
from im_server.gateway.hub import Hub
from im_server.protocol.close_codes import CloseCode
from im_server.services import accounts

TOKEN = "t" * 43
USER = 77


class FakeSocket:
    """The ASGI side of one WebSocket: ``receive`` hands out the scripted events (an
    exception in the script is raised instead), ``send`` records what the app sent."""

    def __init__(self, *events: dict[str, Any] | BaseException) -> None:
        self.script = [{"type": "websocket.connect"}, *events]
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.script:
            await asyncio.sleep(3600)  # a silent client
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def texts(self) -> list[dict[str, Any]]:
        return [json.loads(m["text"]) for m in self.sent if m["type"] == "websocket.send"]

    def closes(self) -> list[tuple[int, str]]:
        return [(m["code"], m["reason"]) for m in self.sent if m["type"] == "websocket.close"]


@pytest.fixture
async def gateway() -> AsyncIterator[ws.Gateway]:
    settings = Settings(
        database_url="postgresql+asyncpg://nobody@127.0.0.1:9/none",
        redis_url="redis://127.0.0.1:9",
        max_frame_bytes=1024,
    )
    ctx = build_context(settings)
    ctx.auth_cache.put(accounts.token_hash(TOKEN), accounts.Session(USER, "phone"))
    hub = Hub()
    yield ws.Gateway(ctx, hub, Fanout(ctx, hub, ctx.redis))
    assert hub.user_connections(USER) == 0, "the connection must be unregistered"
    await asyncio.gather(*ctx.background, return_exceptions=True)
    await ctx.redis.close()
    await ctx.db.dispose()


async def run(gw: ws.Gateway, sock: FakeSocket, token: str | None = TOKEN) -> None:
    scope = {"type": "websocket", "path": ws.PATH, "query_string": f"token={token}".encode()}
    if token is None:
        scope["query_string"] = b""
    await asyncio.wait_for(ws.serve(gw, scope, sock.receive, sock.send), 5)
    await asyncio.sleep(0)  # the close is sent by a task of its own


def text(frame: str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": frame}


def bugs(where: str) -> float:
    return REGISTRY.get_sample_value("im_ws_handler_errors_total", {"where": where}) or 0.0


async def test_frames_in_answers_out(gateway: ws.Gateway) -> None:
    sock = FakeSocket(
        text('{"type": "ping"}'),
        {"type": "websocket.receive", "bytes": b'{"type": "ping"}'},
        text("not json"),
        text('{"type": "send", "conv_id": "s:2:1", "client_msg_id": "a", "content": {}}'),
        {"type": "websocket.disconnect", "code": 1000},
    )
    await run(gateway, sock)
    assert sock.sent[0] == {"type": "websocket.accept"}
    pong, pong2, error, refused = sock.texts()
    assert pong == pong2 == {"type": "pong"}
    assert (error["type"], error["code"]) == ("error", "bad_request")
    assert (refused["type"], refused["ok"], refused["client_msg_id"]) == ("ack", False, "a")
    assert sock.closes() == []


async def test_an_oversize_frame_closes_with_1009(gateway: ws.Gateway) -> None:
    sock = FakeSocket(text("x" * 1025), text('{"type": "ping"}'))
    await run(gateway, sock)
    assert sock.closes() == [(CloseCode.TOO_BIG, "frame too large")]
    assert sock.texts() == []  # nothing is handled after the close


async def test_a_bad_token_closes_with_4401(gateway: ws.Gateway) -> None:
    sock = FakeSocket()
    await run(gateway, sock, token=None)
    assert sock.sent[0] == {"type": "websocket.accept"}
    assert sock.closes() == [(CloseCode.UNAUTHORIZED, "missing or bad token")]


@pytest.mark.parametrize(
    "gone", [OSError("reset"), ConnectionResetError(), BrokenPipeError()], ids=repr
)
async def test_a_client_that_went_away_ends_quietly(
    gateway: ws.Gateway, gone: OSError, caplog: pytest.LogCaptureFixture
) -> None:
    before = bugs("receive")
    sock = FakeSocket(text('{"type": "ping"}'), gone)
    with caplog.at_level(logging.DEBUG, logger="im_server.ws"):
        await run(gateway, sock)
    assert sock.texts() == [{"type": "pong"}]
    assert sock.closes() == []
    assert bugs("receive") == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_handler_bug_is_logged_counted_and_closes_with_1011(
    gateway: ws.Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    before = bugs("receive")
    sock = FakeSocket(text('{"type": "ping"}'), KeyError("a bug"))
    with caplog.at_level(logging.ERROR, logger="im_server.ws"):
        await run(gateway, sock)
    assert bugs("receive") == before + 1
    assert sock.closes() == [(CloseCode.INTERNAL_ERROR, "internal error")]
    [record] = [r for r in caplog.records if r.name == "im_server.ws"]
    assert record.levelno == logging.ERROR and "receive handler failed" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is KeyError  # the traceback


async def test_a_store_fault_is_answered_unavailable_not_counted_as_a_bug(
    gateway: ws.Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """``typing`` in a group needs its members; PostgreSQL cannot be reached here."""
    before = bugs("typing")
    sock = FakeSocket(text('{"type": "typing", "conv_id": "g:5"}'))
    task = asyncio.ensure_future(run(gateway, sock))
    for _ in range(500):
        if sock.texts():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    [error] = sock.texts()
    assert (error["type"], error["code"]) == ("error", "unavailable")
    assert bugs("typing") == before
    assert sock.closes() == []
