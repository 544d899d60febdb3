"""How a failed REST request is answered: every error in the contract's body
``{"error": {"code", "message"}}``.

A store that cannot be reached or is saturated (PostgreSQL down, its connection pool
exhausted, Redis gone) is ``503 unavailable`` with one log line and no traceback: it is
an operating condition, not a bug, and under load it comes by the hundred. Its handlers
are registered for the store exceptions' own classes on purpose: Starlette hands a
handler for plain ``Exception`` to its outermost middleware, which answers and then
raises the exception again, so the server logs an "Exception in ASGI application"
traceback for each. Only a bug reaches the ``Exception`` handler: ``500 internal``, its
traceback logged once."""

from __future__ import annotations

import logging
import time

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from im_server.api.parsing import validation_status
from im_server.errors import ImError, is_store_error
from im_server.metrics import HTTP_HANDLER_ERRORS, STORE_UNAVAILABLE_ANSWERS

log = logging.getLogger("im_server.api")

STORE_FAILURES: tuple[type[BaseException], ...] = (
    OSError,  # TimeoutError and ConnectionError included
    RedisError,
    SQLAlchemyError,  # the pool's TimeoutError, OperationalError, InterfaceError
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)
LOG_EVERY_S = 5.0


class _Throttled:
    """One log line per ``LOG_EVERY_S`` for a burst of the same condition, with how many
    it stands for."""

    def __init__(self) -> None:
        self.last = 0.0
        self.unlogged = 0

    def note(self, what: str) -> None:
        now = time.monotonic()
        self.unlogged += 1
        if now - self.last >= LOG_EVERY_S:
            log.warning(
                "answered 503 unavailable (%d in the last %.0f s): %s",
                self.unlogged,
                min(now - self.last, 3600),
                what,
            )
            self.last, self.unlogged = now, 0


def install_error_handlers(app: FastAPI) -> None:
    unavailable = _Throttled()

    @app.exception_handler(ImError)
    async def _im_error(request: Request, exc: ImError) -> JSONResponse:
        if exc.code == "unavailable":
            STORE_UNAVAILABLE_ANSWERS.inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(
            exc.status_code, "bad_request"
        )
        return JSONResponse(
            {"error": {"code": code, "message": str(exc.detail)}},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = (
            f"{where}: {first.get('msg', 'invalid')}"
            if where
            else str(first.get("msg", "invalid request"))
        )
        return JSONResponse(
            {"error": {"code": "bad_request", "message": msg}}, status_code=validation_status(errs)
        )

    async def _store_failure(request: Request, exc: Exception) -> JSONResponse:
        if is_store_error(exc):
            STORE_UNAVAILABLE_ANSWERS.inc()
            unavailable.note(f"{request.method} {request.url.path}: {type(exc).__name__}")
            return JSONResponse(
                {"error": {"code": "unavailable", "message": "a store is unavailable, try again"}},
                status_code=503,
            )
        return _bug(request, exc)

    for cls in STORE_FAILURES:
        app.add_exception_handler(cls, _store_failure)  # type: ignore[arg-type]

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_store_error(exc):  # a store failure wrapped in another exception
            return await _store_failure(request, exc)
        return _bug(request, exc)


def _bug(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    HTTP_HANDLER_ERRORS.inc()
    return JSONResponse(
        {"error": {"code": "internal", "message": "internal error"}}, status_code=500
    )
