"""The HTTP pool of the client, the benchmarks and the tests, on aiohttp: the one HTTP
client library of the project (the server's push gateway and its S3 client, aiobotocore,
already stand on it).

Why a wrapper of its own: callers deal in whole answers (status, headers, bytes), never
in a response that must be read before its connection goes back to the pool; they
catch one :class:`TransportError` whatever failed underneath (a refused connection, a
timeout, a reset); and the pool's defaults are the ones a test of a server wants: no
redirect followed unless asked (a 302 is an answer to check), no content type made up
for a body that was sent without one, no cookie kept (the contract authenticates by
token), and a URL sent as written (a test of bad input percent-encodes it on purpose).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from im_server.client.errors import ApiError

Params = Mapping[str, str | int | float | bool | None]


class TransportError(Exception):
    """No HTTP answer: the connection was refused, reset or timed out."""


@dataclass(frozen=True, slots=True)
class Response:
    """One whole HTTP answer."""

    status_code: int
    headers: CIMultiDictProxy[str]
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.content)

    def raise_for_status(self) -> None:
        """:class:`~im_server.client.errors.ApiError` for a status of 300 or more."""
        if self.status_code >= 300:
            raise ApiError.from_response(self.status_code, self.content)


def _query(params: Params | None) -> dict[str, str] | None:
    """Query parameters as the server reads them (``true``/``false`` for booleans, a None
    left out)."""
    if not params:
        return None
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _url(url: str) -> URL:
    """The URL as written when it is already encoded (it holds a ``%`` or only ASCII
    that needs no escape), quoted otherwise."""
    if "%" in url or url.isascii() and " " not in url:
        return URL(url, encoded=True)
    return URL(url)


class HttpPool:
    """A pool of keep-alive connections, shared by any number of callers (a benchmark with
    thousands of users keeps one). Made lazily, in the event loop that first uses it."""

    def __init__(
        self,
        *,
        base_url: str = "",
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_connections: int = 100,
        keepalive: float = 4.0,
        on_response: Callable[[Response], None] | None = None,
    ) -> None:
        """``base_url`` is put before a URL that starts with ``/``; ``headers`` go with
        every request (a request's own win); ``on_response`` sees every answer (a
        benchmark counts bytes with it). ``keepalive``: an idle connection is not reused
        after that many seconds, fewer than the server's own 5 (its header timeout
        closes an idle connection): reusing one the server is closing would lose the
        request to a race."""
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._on_response = on_response
        # sock_connect, not connect: aiohttp's ``connect`` also counts the wait for a free
        # connection of the pool, which a burst of queued requests is meant to do
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._max_connections = max_connections
        self._keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _open(self) -> aiohttp.ClientSession:
        self._closed = False
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=self._keepalive
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        content: bytes | str | AsyncIterable[bytes] | None = None,
        json: Any = None,
        params: Params | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        follow_redirects: bool = False,
    ) -> Response:
        """Send one request and read its whole answer; :class:`TransportError` when no
        answer came."""
        if url.startswith("/"):
            url = self.base_url + url
        hdrs: CIMultiDict[str] = CIMultiDict(self._headers)
        hdrs.update(headers or {})
        data: Any = content
        if json is not None:
            data = orjson.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        extra: dict[str, Any] = {}
        if timeout is not None:  # else the pool's (aiohttp reads None as "no limit")
            extra["timeout"] = aiohttp.ClientTimeout(total=timeout)
        if "Content-Type" not in hdrs:
            extra["skip_auto_headers"] = ("Content-Type",)
        try:
            async with self._open().request(
                method,
                _url(url),
                data=data,
                params=_query(params),
                headers=hdrs,
                allow_redirects=follow_redirects,
                **extra,
            ) as resp:
                answer = Response(resp.status, resp.headers, await resp.read(), str(resp.url))
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TransportError(f"{method} {url.split('?')[0]}: {e!r}") from e
        if self._on_response is not None:
            self._on_response(answer)
        return answer

    async def get(self, url: str, **kw: Any) -> Response:
        return await self.request("GET", url, **kw)

    async def post(self, url: str, **kw: Any) -> Response:
        return await self.request("POST", url, **kw)

    async def put(self, url: str, **kw: Any) -> Response:
        return await self.request("PUT", url, **kw)

    async def delete(self, url: str, **kw: Any) -> Response:
        return await self.request("DELETE", url, **kw)

    async def options(self, url: str, **kw: Any) -> Response:
        return await self.request("OPTIONS", url, **kw)

    async def head(self, url: str, **kw: Any) -> Response:
        return await self.request("HEAD", url, **kw)

    @property
    def closed(self) -> bool:
        """Closed by :meth:`aclose` (a pool never used counts as open)."""
        return self._closed

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._closed = True


def request_sync(method: str, url: str, *, timeout: float = 10.0, **kw: Any) -> Response:
    """One request from code that does not run in an event loop, or that may not block
    the one it runs in (a readiness probe, a fixture): a pool of its own, in a thread of
    its own with a loop of its own."""

    async def once() -> Response:
        async with HttpPool(timeout=timeout) as pool:
            return await pool.request(method, url, **kw)

    with ThreadPoolExecutor(1, thread_name_prefix="http-once") as worker:
        return worker.submit(asyncio.run, once()).result()
