"""A real push gateway for tests and the push benchmark: an HTTP server speaking the
receiving side of the Matrix push-gateway API (``POST /_matrix/push/v1/notify``) on a
free loopback port, in a thread of its own (so any event loop, or none, can drive it).

It records every notification with the time it arrived, answers ``{"rejected": [...]}``
for the pushkeys it is told are dead, and can be made to fail (an HTTP status), to be
slow (a delay per request) or to be down (its socket closed, then opened again on the
same port)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from im_server.protocol.push_gateway import NOTIFY_PATH, NOTIFY_REQUEST
from im_server.runtime.embedded import free_port


@dataclass(frozen=True, slots=True)
class Received:
    at: float  # time.time() when it arrived
    notification: dict[str, Any]

    @property
    def pushkeys(self) -> list[str]:
        return [d["pushkey"] for d in self.notification["devices"]]


class RecordingGateway:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.received: list[Received] = []
        self.rejected: set[str] = set()
        self.fail_status: int | None = None  # answer this status instead of 200
        self.delay = 0.0  # seconds before each answer
        self.invalid = 0  # requests that did not match the API's request schema
        self.answer: bytes | None = None  # answer this body instead of the real one
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _notify(self, request: Request) -> Response:
        body = await request.body()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_status is not None:
            return Response(status_code=self.fail_status)
        try:
            NOTIFY_REQUEST.validate_json(body)
        except ValueError:
            with self._lock:
                self.invalid += 1
            return Response(status_code=400)
        n = orjson.loads(body)["notification"]
        with self._lock:
            self.received.append(Received(time.time(), n))
        if self.answer is not None:
            return Response(self.answer, media_type="application/json")
        dead = [d["pushkey"] for d in n["devices"] if d["pushkey"] in self.rejected]
        return Response(orjson.dumps({"rejected": dead}), media_type="application/json")

    def start(self) -> RecordingGateway:
        app = Starlette(routes=[Route(NOTIFY_PATH, self._notify, methods=["POST"])])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the push gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Close the socket: calls fail with connection refused until :meth:`start`."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server = self._thread = None

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def for_keys(
        self, keys: Iterable[str], pred: Callable[[Received], bool] | None = None
    ) -> list[Received]:
        """What arrived for any of these pushkeys (the tests' own devices)."""
        ks = set(keys)
        return [r for r in self.snapshot() if ks & set(r.pushkeys) and (pred is None or pred(r))]
