"""``logs.redact`` and the two formatters: secrets never reach the log text."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator

import orjson
import pytest

from im_server import logs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '127.0.0.1:5 - "WebSocket /v1/ws?token=Ab-9_x.Z~" [accepted]',
            '127.0.0.1:5 - "WebSocket /v1/ws?token=***" [accepted]',
        ),
        ("/v1/ws?x=1&token=abc&y=2", "/v1/ws?x=1&token=***&y=2"),
        ("GET /v1/ws?access_token=abc HTTP/1.1", "GET /v1/ws?access_token=*** HTTP/1.1"),
        ("< Authorization: Bearer abc.def", "< Authorization: Bearer ***"),
        ("authorization: Basic dXNlcjpwdw==", "authorization: Basic ***"),
        ("(b'authorization', b'Bearer zzz')", "(b'authorization', b'Bearer ***')"),
        ("sent BEARER QQQ", "sent BEARER ***"),
        (
            "postgresql+asyncpg://im:s3cr@t@db.internal:5432/im",
            "postgresql+asyncpg://im:***@db.internal:5432/im",
        ),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ('{"username": "a", "password": "hunter2"}', '{"username": "a", "password": "***"}'),
        ("{'password': 'x\\'y', 'n': 1}", "{'password': '***', 'n': 1}"),
        ("connect(password='pw', host='h')", "connect(password='***', host='h')"),
        ("host=db password=pw user=im", "host=db password=*** user=im"),
        ('"metrics_token": "m"', '"metrics_token": "***"'),
        ("$argon2id$v=19$m=1024,t=1,p=1$c2FsdA$aGFzaA", "$argon2id$***"),
        # the names as the server's query parser decodes them (percent escapes, "+")
        (
            '127.0.0.1:5 - "WebSocket /v1/ws?%74oken=Ab-9" [accepted]',
            '127.0.0.1:5 - "WebSocket /v1/ws?%74oken=***" [accepted]',
        ),
        ("/v1/ws?x=1&tok%65n=abc&y=2", "/v1/ws?x=1&tok%65n=***&y=2"),
        ("/v1/ws?%74%6F%6B%65%6E=abc", "/v1/ws?%74%6F%6B%65%6E=***"),
        ("/v1/ws?%54%4FKEN=abc", "/v1/ws?%54%4FKEN=***"),
        ("/v1/ws?+token+=abc", "/v1/ws?+token+=***"),
        ("/v1/ws?access%5Ftoken=abc", "/v1/ws?access%5Ftoken=***"),
        ("/login?pass%77ord=hunter2", "/login?pass%77ord=***"),
        ("GET /v1/ws?%74oken=abc HTTP/1.1", "GET /v1/ws?%74oken=*** HTTP/1.1"),
        # an API key, an app-signed JWT, wherever they show
        ("x-api-key: imk_G6mx60EbfBxrULBU5SB", "x-api-key: imk_***"),
        ("key=imk_ABCdef12_-xyz went", "key=imk_*** went"),
        ("got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig_-1 end", "got eyJhbGciOiJIUzI1NiJ9.*** end"),
        # nothing to hide
        ("key 'backend': PUT /v1/server/users/u-1", "key 'backend': PUT /v1/server/users/u-1"),
        ("imk_ is the prefix", "imk_ is the prefix"),
        ("http://127.0.0.1:8000/v1/ws", "http://127.0.0.1:8000/v1/ws"),
        ("/v1/search?q=a+b&x=%20y", "/v1/search?q=a+b&x=%20y"),
        ("/v1/ws?%74okens=abc", "/v1/ws?%74okens=abc"),
        ("token_hash=abc refreshed", "token_hash=abc refreshed"),
        ("12:00:01 INFO uvicorn.error: Started", "12:00:01 INFO uvicorn.error: Started"),
        ('"password": ""', '"password": ""'),
        # a lower-case form of another length (positions do not map back)
        ("İstanbul token=abc", "İstanbul token=***"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert logs.redact(text) == expected


def test_redact_stays_linear_on_long_words() -> None:
    """A 320 KB query string (an oversize request logged at DEBUG) is no trap: sixteen
    times the input costs about sixteen times the time (a quadratic pattern would cost
    256). Measured as a ratio in the same run, best of five, with room for a busy machine."""

    def shapes(n: int) -> list[str]:
        return [
            "GET /v1/ws?token=" + "a" * n,
            "x://u:" + "a" * n,
            "token: '" + "\\" * (n // 2) + "x" * (n // 2),
            "token: '" * (n // 5),
        ]

    def best(text: str) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            logs.redact(text)
            times.append(time.perf_counter() - started)
        return min(times)

    for small, big in zip(shapes(20_000), shapes(320_000), strict=True):
        t_small, t_big = best(small), best(big)
        assert t_big < 48 * t_small + 0.25, (big[:20], t_small, t_big)


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    logger = logging.getLogger("test.redaction")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, stream
    logger.handlers.clear()
    logger.propagate = True


def _fail_with_secret() -> None:
    raise RuntimeError("cannot connect to postgresql://im:hunter2@db/im")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_formatters_redact_messages_and_tracebacks(
    captured: tuple[logging.Logger, io.StringIO], fmt: str
) -> None:
    logger, stream = captured
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logs.JsonFormatter() if fmt == "json" else logs.TextFormatter("%(levelname)s %(message)s")
    )
    logger.addHandler(handler)
    logger.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:1", "/v1/ws?token=tok-1")
    logger.debug("headers %r", [(b"authorization", b"Bearer tok-2")])
    try:
        _fail_with_secret()
    except RuntimeError:
        logger.exception("store down (%s)", {"password": "pw-3"})
    text = stream.getvalue()
    for secret in ("tok-1", "tok-2", "hunter2", "pw-3"):
        assert secret not in text, text
    assert "token=***" in text and "Bearer ***" in text
    assert "postgresql://im:***@db/im" in text
    assert "Traceback" in text
    if fmt == "json":
        lines = [orjson.loads(line) for line in text.splitlines()]
        assert len(lines) == 3
        assert "RuntimeError" in lines[2]["exc"]


def test_sql_errors_never_carry_their_parameters() -> None:
    """A logged database error (``%r`` of the exception, e.g. the token re-check's) shows
    the statement but not its bound values (token hashes, password hashes)."""
    from sqlalchemy.exc import DBAPIError

    from im_server.config import load_settings
    from im_server.storage.db import create_engine

    engine = create_engine(load_settings(database_url="postgresql://u@127.0.0.1:1/x"))
    assert engine.sync_engine.hide_parameters
    err = DBAPIError(
        "SELECT 1 FROM sessions WHERE token_hash = $1",
        ("secret-token-hash",),
        Exception("boom"),
        hide_parameters=engine.sync_engine.hide_parameters,
    )
    assert "secret-token-hash" not in repr(err) and "secret-token-hash" not in str(err)
