from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson
import pytest

from im_server.client import Client, Connection
from im_server.client.transport import request_sync
from tests.support import MADE, Make, ServerProcess, Stores, befriend, close_made, new_user


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("stores"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def push_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """Stores of their own for the servers with a push gateway: a persister without one
    (the suite's server) on the same stream would store their messages without push
    rows, and their pushers would take each other's rows."""
    s = Stores.start(tmp_path_factory.mktemp("push-stores"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def server(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    os.environ.setdefault("IM_TEST_LOG_DIR", str(tmp_path_factory.mktemp("logs")))
    srv = ServerProcess(env=stores.env()).start()
    yield srv
    srv.terminate()


@pytest.fixture(autouse=True)
async def _close_made_clients() -> AsyncIterator[None]:
    """Every client ``new_user`` made during a test is closed when the test ends (an HTTP
    pool left open holds sockets and warns when collected); fixtures of a wider scope
    were set up before this one, and keep theirs."""
    since = len(MADE)
    yield
    await close_made(since)


@pytest.fixture
def url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture
async def make(url: str) -> AsyncIterator[Make]:
    """Register users (on the shared server, or on ``base``); all closed at the end of
    the test."""
    made: list[Client] = []

    async def _make(prefix: str = "u", base: str | None = None) -> Client:
        c = await new_user(base or url, prefix)
        made.append(c)
        return c

    yield _make
    for c in made:
        await c.aclose()


@pytest.fixture
async def alice(url: str) -> AsyncIterator[Client]:
    c = await new_user(url, "alice")
    yield c
    await c.aclose()


@pytest.fixture
async def bob(url: str) -> AsyncIterator[Client]:
    c = await new_user(url, "bob")
    yield c
    await c.aclose()


@pytest.fixture
async def pair(alice: Client, bob: Client) -> tuple[Client, Client, str]:
    conv = await befriend(alice, bob)
    return alice, bob, conv


@pytest.fixture
def tmp_data(tmp_path: Path) -> Path:
    return tmp_path


# -- every frame a test client receives is checked against the WebSocket frame schema -----
# (the schema the shared server publishes; tests that run servers of their own use the one
# generated in-process from the same models, which test_ws_schema.py proves is the same).
# A frame that breaks it fails the test that received it. IM_TEST_VALIDATE_FRAMES=0: off.


@pytest.fixture(scope="session")
def ws_schema(server: ServerProcess) -> dict[str, Any]:
    r = request_sync("GET", f"{server.url}/v1/protocol/ws-schema", timeout=30)
    assert r.status_code == 200, r.text
    schema: dict[str, Any] = r.json()
    return schema


def server_frame_validator(schema: dict[str, Any]) -> jsonschema_rs.Draft202012Validator:
    """Server frames only: a server must never send what only a client may send."""
    return jsonschema_rs.Draft202012Validator(
        {"$schema": schema["$schema"], "$ref": "#/$defs/server_frame", "$defs": schema["$defs"]}
    )


@pytest.fixture(autouse=True)
def _validate_server_frames(request: pytest.FixtureRequest) -> Iterator[None]:
    if os.environ.get("IM_TEST_VALIDATE_FRAMES", "1") == "0":
        yield
        return
    if "server" in request.fixturenames:
        schema = request.getfixturevalue("ws_schema")
    else:
        from im_server.protocol.schema import ws_schema

        schema = ws_schema()
    validator = server_frame_validator(schema)
    bad: list[str] = []

    def check(raw: bytes) -> None:
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad.append(f"not JSON: {raw[:300]!r}")
            return
        error = next(validator.iter_errors(frame), None)
        if error is not None:
            bad.append(f"{raw[:300]!r}: {error.message} (at {list(error.instance_path)})")

    Connection.frame_hooks.append(check)
    try:
        yield
    finally:
        Connection.frame_hooks.remove(check)
    if bad:
        pytest.fail(
            f"{len(bad)} frame(s) from the server break the WebSocket frame schema:\n"
            + "\n".join(bad[:10]),
            pytrace=False,
        )
