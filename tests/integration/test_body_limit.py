"""Request bodies over IM_MAX_BODY_BYTES are refused with 413 before authentication and
without being read: at once from the Content-Length, and for a chunked body as soon as
the bytes received pass the limit. The server's memory does not grow by the body."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import psutil
import pytest

from im_server.client import Client
from im_server.client.transport import HttpPool, request_sync
from tests import rawhttp
from tests.support import ServerProcess, Stores

LIMIT = 1024 * 1024  # the default of IM_MAX_BODY_BYTES
HUGE = 48 * 1024 * 1024


def _too_large(answer: rawhttp.Answer) -> None:
    assert answer.status == 413, answer.raw[:300]
    assert answer.headers["connection"] == "close"
    assert answer.json() == {
        "error": {"code": "too_large", "message": f"the request body is over {LIMIT} bytes"}
    }


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sessions",  # open to anyone
        "/v1/conversations/s:1:2/messages",  # needs a bearer token (none is sent)
        "/nowhere/at/all",  # no such route
    ],
)
def test_huge_content_length_is_refused_at_once(url: str, server: ServerProcess, path: str) -> None:
    sock = rawhttp.connect(server.port)
    sock.sendall(
        rawhttp.request(
            "POST", path, {"Content-Type": "application/json", "Content-Length": str(HUGE)}
        )
    )
    answer = rawhttp.read_to_close(sock, 5)  # not a byte of the body was sent
    sock.close()
    assert answer.closed and answer.elapsed < 2.0, answer
    _too_large(answer)


def _send_chunked(sock: socket.socket, total: int, chunk: int = 64 * 1024) -> int:
    """Send a chunked body of ``total`` bytes, stopping as soon as the server answers
    (or closes); the number of body bytes sent."""
    sent = 0
    piece = b"x" * chunk
    frame = f"{chunk:x}\r\n".encode() + piece + b"\r\n"
    while sent < total:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            return sent
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            return sent
        sent += chunk
    sock.sendall(b"0\r\n\r\n")
    return sent


def test_chunked_body_over_the_limit_is_refused(server: ServerProcess) -> None:
    sock = rawhttp.connect(server.port)
    sock.sendall(
        rawhttp.request(
            "POST",
            "/v1/sessions",
            {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        )
    )
    sent = _send_chunked(sock, HUGE)
    answer = rawhttp.read_to_close(sock, 5)
    sock.close()
    assert sent < HUGE
    _too_large(answer)


async def test_chunked_body_under_the_limit_goes_through(url: str) -> None:
    body = orjson.dumps({"username": "nobody-here", "password": "wrong-password"})

    async def chunks() -> AsyncIterator[bytes]:
        yield body[:10]
        yield body[10:]

    async with HttpPool(timeout=10) as http:
        r = await http.post(
            url + "/v1/sessions",
            content=chunks(),  # sent chunked: no length known in advance
            headers={"Content-Type": "application/json"},
        )
    assert r.status_code == 401, r.text


def _post(port: int, path: str, body: bytes, token: str | None = None) -> rawhttp.Answer:
    """POST over a raw socket: an answer that comes while the body is still being sent
    is read all the same (an asyncio client loses it when the server resets the
    connection over the unread rest)."""
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    sock = rawhttp.connect(port)
    try:
        try:
            sock.sendall(rawhttp.request("POST", path, headers) + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused part way; the answer is waiting
        return rawhttp.read_response(sock)
    finally:
        sock.close()


async def test_body_at_the_limit_reaches_the_app(
    pair: tuple[Client, Client, str], server: ServerProcess
) -> None:
    """A body of exactly the limit is read and given to the app, which answers by its own
    rules (here: the message content is over IM_MAX_CONTENT_BYTES); one byte more and it
    is the body limit that answers."""
    alice, _, conv = pair
    path = f"/v1/conversations/{conv}/messages"

    def body(size: int) -> bytes:
        frame = orjson.dumps({"client_msg_id": "big-1", "content": {"text": ""}})
        return frame.replace(b'"text":""', b'"text":"' + b"a" * (size - len(frame)) + b'"')

    assert len(body(LIMIT)) == LIMIT
    answer = _post(server.port, path, body(LIMIT), alice.token)
    assert answer.status == 413, answer.raw[:300]
    assert answer.json()["error"]["message"].startswith("content is "), answer.body  # the app's
    _too_large(_post(server.port, path, body(LIMIT + 1), alice.token))
    # without a token: 401 for a small body, 413 for one over the limit
    assert _post(server.port, path, b"{}").status == 401
    _too_large(_post(server.port, path, body(LIMIT + 1)))


def _peak_rss(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


class _RssWatch:
    """Samples a process's RSS in a thread; ``peak`` is the highest sample."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> _RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_memory_does_not_grow_by_the_body(stores: Stores) -> None:
    """A fresh server (its peak RSS is its start-up one) takes two 48 MiB uploads, one
    with a Content-Length and one chunked, and its memory stays where it was."""
    srv = ServerProcess(env=stores.env()).start()
    try:
        assert srv.proc is not None
        pid = srv.proc.pid
        request_sync("GET", srv.url + "/healthz", timeout=5)
        rss_before = psutil.Process(pid).memory_info().rss
        hwm_before = _peak_rss(pid)
        with _RssWatch(pid) as watch:
            for headers in (
                {"Content-Length": str(HUGE)},
                {"Transfer-Encoding": "chunked"},
            ):
                sock = rawhttp.connect(srv.port)
                sock.sendall(
                    rawhttp.request(
                        "POST", "/v1/sessions", {"Content-Type": "application/json", **headers}
                    )
                )
                started = time.monotonic()
                if "Content-Length" in headers:
                    try:
                        sock.sendall(b"x" * HUGE)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # refused part way: what we want
                else:
                    _send_chunked(sock, HUGE)
                answer = rawhttp.read_to_close(sock, 10, started)
                sock.close()
                assert answer.closed
        growth = max(watch.peak - rss_before, _peak_rss(pid) - hwm_before)
        assert growth < 16 * 1024 * 1024, f"the server grew by {growth / 2**20:.1f} MiB"
        assert request_sync("GET", srv.url + "/healthz", timeout=5).status_code == 200
    finally:
        srv.terminate()
