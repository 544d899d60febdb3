"""The client's two exceptions: a refused REST call, and a WebSocket that is gone."""

from __future__ import annotations

import contextlib

import orjson

# A status whose body is not the contract's error shape (a proxy, a crash page) still
# gets a code a caller can test for.
_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    422: "bad_request",
    429: "rate_limited",
    503: "unavailable",
}


class ApiError(Exception):
    """A refused REST call (or WebSocket upgrade): HTTP status plus the contract's
    ``{"error": {"code", "message"}}``. ``code`` falls back to a name derived from the
    status when the body is not the contract's error shape (a proxy, a crash page)."""

    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @classmethod
    def from_response(cls, status: int, body: bytes) -> ApiError:
        code = _STATUS_CODES.get(status, f"http_{status}")
        message = body.decode("utf-8", "replace")[:500]
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.loads(body)
            err = data.get("error") if isinstance(data, dict) else None
            if isinstance(err, dict):
                code = str(err.get("code") or code)
                message = str(err.get("message") or "")
        return cls(status, code, message)


class ConnectionLost(ConnectionError):
    """The WebSocket is closed; raised by sends, pings and waits that can no longer be
    answered. ``code`` is the close code (4401 for a revoked token, 1009 too big...)."""

    def __init__(self, code: int | None, reason: str | None = None) -> None:
        super().__init__(f"websocket closed (code={code}, reason={reason!r})")
        self.code = code
        self.reason = reason
