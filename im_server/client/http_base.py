"""The plumbing of the REST client: one session's HTTP pool and token, and the one call
every typed method of :class:`~im_server.client.http.Client` makes.

Used by the integration tests, the benchmarks and the terminal chat, so it speaks the
public contract (PROTOCOL.md) and nothing else: no server module is imported here. Any
non-2xx answer raises :class:`~im_server.client.errors.ApiError`, so callers (tests above
all) can assert on ``status`` and ``code`` instead of parsing bodies. The WebSocket is
:mod:`im_server.client.socket`; :meth:`Client.connect` opens one with this session's token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import orjson

from im_server.client.errors import ApiError
from im_server.client.socket import Connection
from im_server.client.transport import HttpPool, Response
from im_server.client.wire import JsonObject

UPLOAD_CHUNK = 256 * 1024  # bytes read and sent at a time by Client.upload_file


def decoded(resp: Response) -> Any:
    """A REST answer's JSON body (None for 204 or an empty body); :class:`ApiError` for a
    non-2xx status."""
    if resp.status_code >= 300:
        raise ApiError.from_response(resp.status_code, resp.content)
    if resp.status_code == 204 or not resp.content:
        return None
    return orjson.loads(resp.content)


def object_of(data: Any, path: str) -> JsonObject:
    """``data`` if it is a JSON object; an answer of another shape breaks the contract."""
    if not isinstance(data, dict):
        raise TypeError(f"{path} answered {type(data).__name__}, not a JSON object")
    return data


def _objects(data: Any, path: str) -> list[JsonObject]:
    """``data`` if it is a list of JSON objects (see :func:`object_of`)."""
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise TypeError(f"{path} answered {type(data).__name__}, not a list of objects")
    return data


class ClientBase:
    """REST + WebSocket client for one user session.

    ``http`` may be shared by many clients (a benchmark with thousands of users wants
    one connection pool): every request carries its own token and absolute URL, and a
    shared pool is not closed by :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        user_id: int | None = None,
        http: HttpPool | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.user_id = user_id
        self.username: str | None = None
        self.device_id: str | None = None
        self._own_http = http is None
        self.http = http or HttpPool(timeout=30.0, connect_timeout=10.0)
        self._conns: set[Connection] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Client user_id={self.user_id} username={self.username!r}>"

    # -- plumbing ----------------------------------------------------------------------
    def auth_headers(self) -> dict[str, str]:
        """This session's bearer token, as every authenticated request carries it."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # the pool's own timeout
    ) -> Any:
        """One REST call; the decoded JSON body, None for 204, :class:`ApiError` for any
        non-2xx. Public so that tests can send what the typed methods would not."""
        resp = await self.http.request(
            method,
            self.base_url + path,
            json=json,
            params=params,
            headers=self.auth_headers(),
            timeout=timeout,
        )
        return decoded(resp)

    async def _obj(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # the pool's own timeout
    ) -> JsonObject:
        """:meth:`request` for a call whose answer is a JSON object."""
        data = await self.request(method, path, json=json, params=params, timeout=timeout)
        return object_of(data, path)

    async def _list(self, method: str, path: str, *, json: Any = None) -> list[JsonObject]:
        """:meth:`request` for a call whose answer is a list of JSON objects."""
        return _objects(await self.request(method, path, json=json), path)

    async def aclose(self) -> None:
        """Close the HTTP pool if owned (the client closes its sockets first)."""
        if self._own_http:
            await self.http.aclose()
