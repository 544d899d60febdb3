from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from im_server.client import Client
from tests.support import ServerProcess, Stores, befriend, new_user


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("stores"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def server(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    os.environ.setdefault("IM_TEST_LOG_DIR", str(tmp_path_factory.mktemp("logs")))
    srv = ServerProcess(env=stores.env()).start()
    yield srv
    srv.terminate()


@pytest.fixture
def url(server: ServerProcess) -> str:
    return server.url


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
