"""/metrics behind a token (IM_METRICS_TOKEN) or on an address of its own
(IM_METRICS_LISTEN); with neither, it is open on the main port (test_ops)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from im_server.client.transport import Response, request_sync
from im_server.runtime.embedded import free_port
from tests.support import ServerProcess, Stores

TOKEN = "metrics-token-5f2b9c"


@pytest.fixture(scope="module")
def with_token(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**stores.env(), "IM_METRICS_TOKEN": TOKEN}).start()
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def with_listener(stores: Stores) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    srv = ServerProcess(
        env={
            **stores.env(),
            "IM_METRICS_LISTEN": f"127.0.0.1:{port}",
            "IM_METRICS_TOKEN": TOKEN,
        }
    ).start()
    yield srv, f"http://127.0.0.1:{port}"
    srv.terminate()


def _is_metrics(r: Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert "# TYPE im_sends_total counter" in r.text


def _refused(r: Response) -> None:
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    assert "im_sends_total" not in r.text


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN],
)
def test_token_is_required(with_token: ServerProcess, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    _refused(request_sync("GET", with_token.url + "/metrics", headers=headers, timeout=10))


def test_token_opens_the_metrics(with_token: ServerProcess) -> None:
    for scheme in ("Bearer", "bearer"):
        r = request_sync(
            "GET",
            with_token.url + "/metrics",
            headers={"Authorization": f"{scheme} {TOKEN}"},
            timeout=10,
        )
        _is_metrics(r)
    # the rest of the API is not affected
    assert request_sync("GET", with_token.url + "/healthz", timeout=10).status_code == 200


def test_listener_serves_the_metrics_and_the_main_port_does_not(
    with_listener: tuple[ServerProcess, str],
) -> None:
    srv, metrics_url = with_listener
    main = request_sync(
        "GET", srv.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert main.status_code == 404, main.text
    assert main.json()["error"]["code"] == "not_found"
    _refused(request_sync("GET", metrics_url + "/metrics", timeout=10))
    _is_metrics(
        request_sync(
            "GET",
            metrics_url + "/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
    )


def test_listener_without_token(stores: Stores) -> None:
    port = free_port()
    srv = ServerProcess(env={**stores.env(), "IM_METRICS_LISTEN": f"127.0.0.1:{port}"}).start()
    try:
        _is_metrics(request_sync("GET", f"http://127.0.0.1:{port}/metrics", timeout=10))
        assert request_sync("GET", srv.url + "/metrics", timeout=10).status_code == 404
    finally:
        assert srv.terminate() == 0
