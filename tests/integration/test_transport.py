"""Connection deadlines and request-head limits, with raw sockets against a real server:
a connection that sends no whole request in time is closed, whether it says nothing,
trickles its headers or never finishes its body; keep-alive requests and idle WebSockets
stay open; an oversize request head (a WebSocket upgrade with a 100 KB URL among them)
is answered at once. And the client address behind a trusted proxy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from im_server.client.transport import HttpPool
from tests import rawhttp
from tests.support import ServerProcess, Stores, eventually, new_user

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 2.0
MARGIN = 1.5  # scheduling slack on a busy machine


@pytest.fixture(scope="module")
def quick(stores: Stores) -> Iterator[ServerProcess]:
    """A server with short deadlines, trusting no proxy on this machine."""
    srv = ServerProcess(
        env={
            **stores.env(),
            "IM_REQUEST_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "IM_REQUEST_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
            "IM_FORWARDED_ALLOW_IPS": "10.9.9.9",
        }
    ).start()
    yield srv
    srv.terminate()


def ws_upgrade(path: str) -> bytes:
    return rawhttp.request(
        "GET",
        path,
        {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )


def test_silent_connection_is_closed(quick: ServerProcess) -> None:
    sock = rawhttp.connect(quick.port)
    answer = rawhttp.read_to_close(sock, HEADER_TIMEOUT + 5)
    sock.close()
    assert answer.closed, "a silent connection is still open"
    assert HEADER_TIMEOUT - 0.2 < answer.elapsed < HEADER_TIMEOUT + MARGIN, answer.elapsed
    assert answer.raw == b""  # nothing had begun: no answer, just the close


def test_trickled_headers_are_cut_off(quick: ServerProcess) -> None:
    req = rawhttp.request("GET", "/healthz", {"User-Agent": "slow-loris", "Accept": "*/*"})
    sock = rawhttp.connect(quick.port)
    started = time.monotonic()
    sent = rawhttp.send_slowly(sock, req, 0.3, until=started + HEADER_TIMEOUT + 5)
    answer = rawhttp.read_to_close(sock, 5, started)
    sock.close()
    assert sent < len(req), "the whole request went through at a byte every 0.3 s"
    assert answer.closed
    assert answer.elapsed < HEADER_TIMEOUT + MARGIN, answer.elapsed
    assert answer.status == 408, answer.raw
    assert answer.headers["connection"] == "close"


def test_slow_body_is_cut_off(quick: ServerProcess) -> None:
    body = b'{"username": "slowbody", "password": "password-1234"}'
    head = rawhttp.request(
        "POST", "/v1/users", {"Content-Type": "application/json", "Content-Length": str(len(body))}
    )
    sock = rawhttp.connect(quick.port)
    sock.sendall(head)
    started = time.monotonic()
    sent = rawhttp.send_slowly(sock, body, 0.3, until=started + BODY_TIMEOUT + 5)
    answer = rawhttp.read_to_close(sock, 5, started)
    sock.close()
    assert sent < len(body)
    assert answer.closed
    assert answer.elapsed < BODY_TIMEOUT + MARGIN, answer.elapsed
    assert answer.status == 408, answer.raw


def test_keep_alive_requests_carry_on(quick: ServerProcess) -> None:
    """Requests on one connection, each within the head deadline of the last response,
    for longer than both deadlines together; then silence closes it."""
    sock = rawhttp.connect(quick.port)
    started = time.monotonic()
    for _ in range(8):
        sock.sendall(rawhttp.request("GET", "/healthz"))
        answer = rawhttp.read_response(sock)
        assert answer.status == 200 and not answer.closed, answer.raw
        time.sleep(HEADER_TIMEOUT / 2)  # pacing the client
    assert time.monotonic() - started > HEADER_TIMEOUT + BODY_TIMEOUT
    # a body sent in two parts within its deadline is fine too
    body = b'{"username": "x", "password": "y"}'
    sock.sendall(
        rawhttp.request("POST", "/v1/sessions", {"Content-Length": str(len(body))}, body[:5])
    )
    time.sleep(BODY_TIMEOUT / 2)  # pacing the client
    sock.sendall(body[5:])
    answer = rawhttp.read_response(sock)
    assert answer.status in (401, 422), answer.raw
    idle = rawhttp.read_to_close(sock, HEADER_TIMEOUT + 5)
    sock.close()
    assert idle.closed and idle.elapsed < HEADER_TIMEOUT + MARGIN, idle
    assert idle.raw == b""


async def test_websocket_outlives_the_deadlines(quick: ServerProcess) -> None:
    user = await new_user(quick.url, "wsidle")
    try:
        conn = await user.connect()
        # idle for longer than both deadlines (pacing, not waiting for a condition)
        await asyncio.sleep(HEADER_TIMEOUT + BODY_TIMEOUT + 0.5)
        assert not conn.closed.is_set()
        await conn.ping()
    finally:
        await user.aclose()


async def test_many_slow_sockets_are_closed_and_the_server_answers(
    quick: ServerProcess,
) -> None:
    slow = await rawhttp.open_many(quick.port, 150)
    silent = await rawhttp.open_many(quick.port, 50)
    try:
        for _, writer in slow:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        async with HttpPool(timeout=5) as http:
            assert (await http.get(quick.url + "/healthz")).status_code == 200
        closed = await asyncio.gather(
            *(rawhttp.wait_closed(r, HEADER_TIMEOUT + 5) for r, _ in slow + silent)
        )
        assert all(closed), f"{closed.count(False)} of {len(closed)} sockets still open"
        assert time.monotonic() - started < HEADER_TIMEOUT + MARGIN + 1
        async with HttpPool(timeout=5) as http:
            assert (await http.get(quick.url + "/healthz")).status_code == 200
    finally:
        rawhttp.close_all([w for _, w in slow + silent])


@pytest.mark.parametrize("size", [10_000, 100_000])
def test_oversize_websocket_url_is_answered(quick: ServerProcess, size: int) -> None:
    """10 KB passes the HTTP parser but not the WebSocket library's 8 KiB request line;
    100 KB is over the head cap. Both are answered 414 and closed at once."""
    sock = rawhttp.connect(quick.port)
    sock.sendall(ws_upgrade("/v1/ws?token=" + "a" * size))
    answer = rawhttp.read_to_close(sock, 5)
    sock.close()
    assert answer.closed and answer.elapsed < 1.0, answer
    assert answer.status == 414, answer.raw[:200]


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Big": "b" * 100_000},
        {f"X-Many-{i}": "m" * 100 for i in range(1000)},
    ],
    ids=["one-big-header", "many-headers"],
)
def test_oversize_head_is_refused(quick: ServerProcess, headers: dict[str, str]) -> None:
    sock = rawhttp.connect(quick.port)
    sock.sendall(rawhttp.request("GET", "/healthz", headers))
    answer = rawhttp.read_to_close(sock, 5)
    sock.close()
    assert answer.closed and answer.elapsed < 1.0, answer
    assert answer.status == 431, answer.raw[:200]
    assert answer.json() == {
        "error": {"code": "too_large", "message": "the request headers are over 65536 bytes"}
    }


def test_head_just_under_the_cap_is_served(quick: ServerProcess) -> None:
    sock = rawhttp.connect(quick.port)
    sock.sendall(rawhttp.request("GET", "/healthz", {"X-Big": "b" * 60_000}))
    answer = rawhttp.read_response(sock)
    sock.close()
    assert answer.status == 200, answer.raw[:200]


def test_trickled_header_value_is_capped(quick: ServerProcess) -> None:
    """A header value sent in many reads (httptools buffers it whole) is stopped at the
    cap, long before the deadline."""
    sock = rawhttp.connect(quick.port)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ")
    started = time.monotonic()
    sent = 0
    while sent < 1_000_000 and not rawhttp.closed_by_server(sock):
        try:
            sock.sendall(b"v" * 8192)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 8192
        time.sleep(0.001)  # pacing: one read per write
    answer = rawhttp.read_to_close(sock, 5, started)
    sock.close()
    assert sent < 1_000_000
    assert answer.closed and answer.elapsed < HEADER_TIMEOUT, answer
    assert answer.status == 431, answer.raw[:200]


def _log(srv: ServerProcess) -> str:
    assert srv.log_path is not None
    return Path(srv.log_path).read_text(errors="replace")


async def _ws_line(srv: ServerProcess, needle: str) -> str:
    async def found() -> str | None:
        return next((ln for ln in _log(srv).splitlines() if needle in ln), None)

    line: str = await eventually(found, timeout=5)
    return line


async def test_client_address_from_a_trusted_proxy(server: ServerProcess) -> None:
    """The default trusts the proxy on 127.0.0.1: the app sees X-Forwarded-For (here in
    the server's line for the WebSocket)."""
    user = await new_user(server.url, "proxied")
    try:
        await user.connect(additional_headers={"X-Forwarded-For": "203.0.113.7"})
        line = await _ws_line(server, '203.0.113.7:0 - "WebSocket /v1/ws?token=')
        assert "[accepted]" in line
    finally:
        await user.aclose()


async def test_forwarded_for_from_an_untrusted_peer_is_ignored(quick: ServerProcess) -> None:
    user = await new_user(quick.url, "notproxied")
    try:
        await user.connect(additional_headers={"X-Forwarded-For": "203.0.113.8"})
        line = await _ws_line(quick, '- "WebSocket /v1/ws?token=')
        assert "127.0.0.1:" in line.split(' - "WebSocket')[0], line
        assert "203.0.113.8" not in _log(quick)
    finally:
        await user.aclose()
