"""Raw HTTP over plain sockets, for the transport tests: requests that no HTTP client
would send (a silent connection, headers trickled a byte at a time, a body that never
ends, a 48 MiB upload cut short) and answers read up to the server's close."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class Answer:
    raw: bytes
    closed: bool  # the server closed (or reset) the connection
    elapsed: float  # seconds until the close, or until the wait gave up

    @property
    def status(self) -> int | None:
        if not self.raw.startswith(b"HTTP/1.1 "):
            return None
        return int(self.raw[9:12])

    @property
    def headers(self) -> dict[str, str]:
        head = self.raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head)}

    @property
    def body(self) -> bytes:
        return self.raw.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in self.raw else b""

    def json(self) -> Any:
        return orjson.loads(self.body)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_to_close(sock: socket.socket, timeout: float, started: float | None = None) -> Answer:
    """Read until the server closes or ``timeout`` passes (then ``closed`` is False)."""
    started = time.monotonic() if started is None else started
    deadline = time.monotonic() + timeout
    raw = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Answer(raw, False, time.monotonic() - started)
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return Answer(raw, False, time.monotonic() - started)
        except ConnectionResetError:
            return Answer(raw, True, time.monotonic() - started)
        if not data:
            return Answer(raw, True, time.monotonic() - started)
        raw += data


def read_response(sock: socket.socket, timeout: float = 10.0) -> Answer:
    """Read one response with a Content-Length, leaving the connection open."""
    started = time.monotonic()
    sock.settimeout(timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        data = sock.recv(65536)
        if not data:
            return Answer(raw, True, time.monotonic() - started)
        raw += data
    length = int(Answer(raw, False, 0).headers.get("content-length", "0"))
    head_len = raw.index(b"\r\n\r\n") + 4
    while len(raw) < head_len + length:
        data = sock.recv(65536)
        if not data:
            return Answer(raw, True, time.monotonic() - started)
        raw += data
    return Answer(raw, False, time.monotonic() - started)


def send_slowly(sock: socket.socket, data: bytes, interval: float, until: float) -> int:
    """Send ``data`` a byte every ``interval`` seconds until it is all sent, the server
    closes, or ``until`` (a monotonic time) passes; the number of bytes sent."""
    sent = 0
    while sent < len(data) and time.monotonic() < until:
        try:
            sock.sendall(data[sent : sent + 1])
        except (BrokenPipeError, ConnectionResetError):
            return sent
        sent += 1
        # pacing the slow client, not waiting for anything
        time.sleep(interval)
        if closed_by_server(sock):
            return sent
    return sent


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed: a non-blocking peek sees EOF (or a reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def request(
    method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def open_many(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]


async def wait_closed(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True once the server closed the connection (EOF or reset) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            data = await asyncio.wait_for(reader.read(65536), left)
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
        if not data:
            return True


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for w in writers:
        w.close()
