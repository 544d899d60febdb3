"""Who may read the metrics, and where.

With ``IM_METRICS_TOKEN``, ``/metrics`` asks for ``Authorization: Bearer <token>``. With
``IM_METRICS_LISTEN`` (``host:port``) the metrics are served on that address instead, by
prometheus_client's WSGI app in a thread of its own (say a private interface that only
the Prometheus server reaches), and the main port's ``/metrics`` answers 404; the token,
when set, is asked for there too."""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import make_wsgi_app

from im_server.config import Settings

log = logging.getLogger("im_server.metrics")

UNAUTHORIZED = orjson.dumps(
    {"error": {"code": "unauthorized", "message": "send Authorization: Bearer <metrics token>"}}
)


def bearer_ok(header: str | None, token: str) -> bool:
    """``header`` is ``Bearer <token>``; compared in constant time (digests of equal
    length, so not even the token's length shows)."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(
        hashlib.sha256(given.strip().encode()).digest(), hashlib.sha256(token.encode()).digest()
    )


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9100`` for IPv6; an empty host is every interface)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"IM_METRICS_LISTEN must be host:port, not {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Handler(WSGIRequestHandler):
    timeout = 10  # seconds a client may take over its request

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged (the scraper asks every few seconds)."""


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _with_token(app: WsgiApp, token: str | None) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if token is not None and not bearer_ok(environ.get("HTTP_AUTHORIZATION"), token):
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(UNAUTHORIZED))),
                    ("WWW-Authenticate", "Bearer"),
                ],
            )
            return [UNAUTHORIZED]
        return app(environ, start_response)

    return guarded


class MetricsListener:
    """The metrics on an address of their own, until :meth:`stop`."""

    def __init__(self, listen: str, token: str | None) -> None:
        host, port = parse_listen(listen)

        class Server(_Server):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.server = make_server(
            host, port, _with_token(make_wsgi_app(), token), Server, handler_class=_Handler
        )
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="metrics-listener", daemon=True
        )
        self.thread.start()
        log.info("metrics on http://%s/metrics", listen)

    @classmethod
    def for_settings(cls, settings: Settings) -> MetricsListener | None:
        if not settings.metrics_listen:
            return None
        token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
        return cls(settings.metrics_listen, token)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
