"""The REST side of the client: :class:`Client`, one user session.

Used by the integration tests, the benchmarks and the terminal chat, so it speaks the
public contract (PROTOCOL.md) and nothing else: no server module is imported here. Any
non-2xx answer raises :class:`~im_server.client.errors.ApiError`, so callers (tests above
all) can assert on ``status`` and ``code`` instead of parsing bodies. The calls are
grouped by what they are for: accounts and sessions here, people and conversations in
``http_chat.py``, files and push registrations in ``http_files.py``, the plumbing in
``http_base.py``. The WebSocket is :mod:`im_server.client.socket`; :meth:`Client.connect`
opens one with this session's token.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import quote

from im_server.client.http_chat import ChatApi
from im_server.client.http_files import FilesApi
from im_server.client.socket import Connection, EventCallback, open_connection, ws_url
from im_server.client.transport import HttpPool
from im_server.client.wire import JsonObject


class Client(ChatApi, FilesApi):
    """REST + WebSocket client for one user session.

    ``http`` may be shared by many clients (a benchmark with thousands of users wants
    one connection pool): every request carries its own token and absolute URL, and a
    shared pool is not closed by :meth:`aclose`.
    """

    # -- accounts ----------------------------------------------------------------------
    @classmethod
    async def register(
        cls,
        base_url: str,
        username: str,
        password: str,
        display_name: str | None = None,
        *,
        device_id: str | None = None,
        http: HttpPool | None = None,
    ) -> Client:
        """Create the account, then log in: the returned client holds a token."""
        client = cls(base_url, http=http)
        try:
            body: dict[str, Any] = {"username": username, "password": password}
            if display_name is not None:
                body["display_name"] = display_name
            await client.request("POST", "/v1/users", json=body)
            await client._login(username, password, device_id)
        except BaseException:
            await client.aclose()
            raise
        return client

    @classmethod
    async def login(
        cls,
        base_url: str,
        username: str,
        password: str,
        device_id: str | None = None,
        *,
        http: HttpPool | None = None,
    ) -> Client:
        client = cls(base_url, http=http)
        try:
            await client._login(username, password, device_id)
        except BaseException:
            await client.aclose()
            raise
        return client

    async def _login(self, username: str, password: str, device_id: str | None) -> None:
        body: dict[str, Any] = {"username": username, "password": password}
        if device_id is not None:
            body["device_id"] = device_id
        data = await self._obj("POST", "/v1/sessions", json=body)
        self.token, self.user_id = data["token"], int(data["user_id"])
        self.device_id, self.username = data.get("device_id"), username

    async def me(self) -> JsonObject:
        data = await self._obj("GET", "/v1/me")
        self.user_id, self.username = int(data["user_id"]), data.get("username")
        return data

    async def logout(self) -> None:
        """Revoke this token. It is kept on the object, so tests can check it is dead."""
        await self.request("DELETE", "/v1/sessions/current")

    async def sessions(self) -> list[JsonObject]:
        """My live sessions: ``[{device_id, created_at, last_used_at, current}]``."""
        return await self._list("GET", "/v1/sessions")

    async def revoke_session(self, device_id: str) -> None:
        """Revoke my session on another device (or this one)."""
        await self.request("DELETE", "/v1/sessions/" + quote(device_id, safe=""))

    async def logout_everywhere(self) -> None:
        """Revoke every session of mine, this token's too."""
        await self.request("DELETE", "/v1/sessions")

    async def change_password(self, old_password: str, new_password: str) -> None:
        """Every other session of mine is revoked; this token stays valid."""
        body = {"old_password": old_password, "new_password": new_password}
        await self.request("PUT", "/v1/me/password", json=body)

    async def export(self) -> JsonObject:
        """My data: ``{user, friends, blocks, groups, messages}`` (the messages I sent)."""
        return await self._obj("GET", "/v1/me/export")

    async def delete_account(self, password: str) -> None:
        """Delete my account: every token of mine dies, this one too."""
        await self.request("DELETE", "/v1/me", json={"password": password})

    # -- websocket ---------------------------------------------------------------------
    def ws_url(self) -> str:
        return ws_url(self.base_url, self.token)

    async def connect(
        self,
        *,
        on_event: EventCallback | None = None,
        queue_events: bool = True,
        **ws_options: Any,
    ) -> Connection:
        """Open a WebSocket with this token.

        An upgrade refused with an HTTP status raises :class:`ApiError` (401/403 for a
        bad token). A server that accepts and then closes (4401) yields a
        :class:`Connection` whose :attr:`~Connection.closed` is set soon after.
        Compression is off by default: frames are small and the benchmark should
        measure the server, not zlib; ``ws_options`` override any default.
        """
        conn = await open_connection(
            self.ws_url(), on_event=on_event, queue_events=queue_events, **ws_options
        )
        self._conns.add(conn)
        conn.reader.add_done_callback(lambda _t: self._conns.discard(conn))
        return conn

    async def aclose(self) -> None:
        """Close every socket opened by this client, then the HTTP pool if owned."""
        conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
        await super().aclose()
