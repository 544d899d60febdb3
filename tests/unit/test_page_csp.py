"""The web client's Content-Security-Policy names the object store's origin (where the
page PUTs uploads and loads pictures from), the public endpoint when there is one."""

from __future__ import annotations

from fastapi import FastAPI

from im_server.config import load_settings
from im_server.transport import headers
from im_server.transport.guard import HttpGuard


def csp_of(guard: HttpGuard) -> dict[str, str]:
    value = dict(guard.page_headers)[b"content-security-policy"].decode()
    return {d.split(" ", 1)[0]: d for d in (x.strip() for x in value.split(";"))}


def guard_for(**settings: object) -> HttpGuard:
    app = FastAPI()
    app.state.settings = load_settings(**settings)
    return HttpGuard(app, 1024)


def test_origin_of_endpoints() -> None:
    assert headers.origin("http://127.0.0.1:8333") == "http://127.0.0.1:8333"
    assert headers.origin("https://S3.Example.com/some/path?x=1") == "https://s3.example.com"
    assert headers.origin("") is None
    assert headers.origin(None) is None
    assert headers.origin("not a url") is None


def test_public_endpoint_is_the_allowed_origin() -> None:
    csp = csp_of(
        guard_for(
            s3_endpoint="http://10.0.0.5:8333", s3_public_endpoint="https://files.example.com"
        )
    )
    assert csp["img-src"] == "img-src 'self' data: blob: https://files.example.com"
    assert csp["connect-src"] == "connect-src 'self' https://files.example.com"
    assert "10.0.0.5" not in str(csp)


def test_store_endpoint_when_no_public_one() -> None:
    csp = csp_of(guard_for(s3_endpoint="http://127.0.0.1:8333/"))
    assert csp["connect-src"] == "connect-src 'self' http://127.0.0.1:8333"
    assert csp["script-src"] == "script-src 'self'"  # nothing else widens


def test_no_store_no_extra_origin() -> None:
    csp = csp_of(guard_for(s3_endpoint=None))
    assert csp["img-src"] == "img-src 'self' data: blob:"
    assert csp["connect-src"] == "connect-src 'self'"
