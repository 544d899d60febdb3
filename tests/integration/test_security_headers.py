"""Security headers: on every HTTP response (errors too, and those of the transport),
a strict Content-Security-Policy on the web client's files (pictures and uploads may
reach the object store's origin, nothing else), and the WebSocket handshake left as it
was."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import pytest

from im_server.client import Client
from im_server.client.transport import HttpPool
from tests import rawhttp
from tests.support import ServerProcess, Stores

BASE = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def csp_directives(store_origin: str) -> set[str]:
    return {
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        f"img-src 'self' data: blob: {store_origin}",
        f"connect-src 'self' {store_origin}",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    }


@pytest.fixture
def store_origin(stores: Stores) -> str:
    """The suite's server has no public endpoint: its clients use the store's own."""
    parts = urlsplit(stores.s3.endpoint)
    return f"{parts.scheme}://{parts.netloc}"


def _has_base(headers: Mapping[str, str]) -> None:
    for name, value in BASE.items():
        assert headers.get(name) == value, (name, dict(headers))


def _has_page_policies(headers: Mapping[str, str], store_origin: str) -> None:
    _has_base(headers)
    csp = {d.strip() for d in headers["content-security-policy"].split(";")}
    assert csp == csp_directives(store_origin), csp
    assert headers["cross-origin-opener-policy"] == "same-origin"
    policy = headers["permissions-policy"]
    for feature in ("camera", "microphone", "geolocation", "payment", "usb"):
        assert f"{feature}=()" in policy, policy


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/", 200),
        ("GET", "/index.html", 200),
        ("GET", "/main.js", 200),
        ("GET", "/style.css", 200),
        ("GET", "/healthz", 200),
        ("GET", "/metrics", 200),
        ("GET", "/openapi.json", 200),
        ("GET", "/v1/me", 401),
        ("GET", "/no/such/file.js", 404),
        ("POST", "/v1/users", 422),
    ],
)
async def test_every_response_carries_the_headers(
    url: str, store_origin: str, method: str, path: str, status: int
) -> None:
    async with HttpPool(timeout=10) as http:
        r = await http.request(method, url + path, json={} if method == "POST" else None)
    assert r.status_code == status, r.text
    _has_page_policies(r.headers, store_origin)


async def test_api_docs_page_keeps_its_scripts(url: str) -> None:
    """The interactive docs load Swagger UI from a CDN and start it inline: they get the
    base headers, not the web client's CSP."""
    async with HttpPool(timeout=10) as http:
        r = await http.get(url + "/docs")
    assert r.status_code == 200
    _has_base(r.headers)
    assert "content-security-policy" not in r.headers


async def test_authenticated_json_carries_the_headers(
    alice: Client, url: str, store_origin: str
) -> None:
    async with HttpPool(timeout=10) as http:
        r = await http.get(url + "/v1/me", headers={"Authorization": f"Bearer {alice.token}"})
    assert r.status_code == 200
    _has_page_policies(r.headers, store_origin)


def test_transport_errors_carry_the_base_headers(server: ServerProcess) -> None:
    sock = rawhttp.connect(server.port)
    sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    answer = rawhttp.read_to_close(sock, 5)
    sock.close()
    assert answer.status == 400, answer.raw
    _has_base(answer.headers)


async def test_websocket_handshake_is_untouched(alice: Client) -> None:
    conn = await alice.connect()
    try:
        headers = conn.ws.response.headers if conn.ws.response else {}
        assert "content-security-policy" not in headers
        assert "x-frame-options" not in headers
        await conn.ping()
    finally:
        await conn.close()
