"""A bug in a REST handler: answered 500 with the contract's error body (no traceback or
exception text to the client), logged with its traceback, and counted in
``im_http_handler_errors_total``. The app runs in-process without its lifespan (uvicorn
in this event loop, on a free local port), so no store is needed."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
import uvicorn

from im_server import metrics
from im_server.app import create_app
from im_server.client import HttpPool, Response
from im_server.config import load_settings


async def _get_raising(error: Exception, path: str) -> Response:
    """GET a route that raises ``error``, on an app without its lifespan."""
    app = create_app(load_settings(database_url="postgresql://u@127.0.0.1:1/x"))

    async def route() -> None:
        raise error

    app.add_api_route(path, route)
    app.router.routes.insert(0, app.router.routes.pop())  # ahead of the web client's mount
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="critical"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no event to wait on)
            await asyncio.sleep(0.01)
        async with HttpPool() as http:
            return await http.get(f"http://127.0.0.1:{sock.getsockname()[1]}{path}")
    finally:
        server.should_exit = True
        await serving
        sock.close()


def _bugs() -> float:
    return float(metrics.HTTP_HANDLER_ERRORS._value.get())


async def test_a_handler_bug_is_answered_500_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _bugs()
    with caplog.at_level(logging.ERROR, logger="im_server.app"):
        resp = await _get_raising(ZeroDivisionError("secret detail"), "/v1/broken")
    assert resp.status_code == 500
    assert resp.json() == {"error": {"code": "internal", "message": "internal error"}}
    assert "secret detail" not in resp.text
    assert _bugs() == before + 1
    logged = [r for r in caplog.records if "unexpected error on GET /v1/broken" in r.getMessage()]
    assert logged and logged[0].exc_info is not None


async def test_a_store_failure_is_503_and_not_counted_as_a_bug() -> None:
    before = _bugs()
    resp = await _get_raising(ConnectionRefusedError("connection refused"), "/v1/store-down")
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "unavailable"
    assert _bugs() == before
