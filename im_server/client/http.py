"""The REST side of the client: :class:`Client`, one user session.

Used by the integration tests, the benchmarks and the terminal chat, so it speaks the
public contract (PROTOCOL.md) and nothing else: no server module is imported here. Any
non-2xx answer raises :class:`~im_server.client.errors.ApiError`, so callers (tests above
all) can assert on ``status`` and ``code`` instead of parsing bodies. The WebSocket is
:mod:`im_server.client.socket`; :meth:`Client.connect` opens one with this session's token.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from im_server.client.errors import ApiError
from im_server.client.socket import Connection, EventCallback, open_connection, ws_url
from im_server.client.wire import JsonObject, conv_path, send_body

UPLOAD_CHUNK = 256 * 1024  # bytes read and sent at a time by Client.upload_file


def _object(data: Any, path: str) -> JsonObject:
    """``data`` if it is a JSON object; an answer of another shape breaks the contract."""
    if not isinstance(data, dict):
        raise TypeError(f"{path} answered {type(data).__name__}, not a JSON object")
    return data


def _objects(data: Any, path: str) -> list[JsonObject]:
    """``data`` if it is a list of JSON objects (see :func:`_object`)."""
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise TypeError(f"{path} answered {type(data).__name__}, not a list of objects")
    return data


class Client:
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
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.user_id = user_id
        self.username: str | None = None
        self.device_id: str | None = None
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))
        self._conns: set[Connection] = set()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Client user_id={self.user_id} username={self.username!r}>"

    # -- plumbing ----------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # httpx's own timeout
    ) -> Any:
        """One REST call; the decoded JSON body, None for 204, :class:`ApiError` for any
        non-2xx. Public so that tests can send what the typed methods would not."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        content = None
        if json is not None:
            content = orjson.dumps(json)
            headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        resp = await self.http.request(
            method,
            self.base_url + path,
            content=content,
            params=query or None,
            headers=headers,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
        )
        if resp.status_code >= 300:
            raise ApiError.from_response(resp.status_code, resp.content)
        if resp.status_code == 204 or not resp.content:
            return None
        return orjson.loads(resp.content)

    async def _obj(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,  # httpx's own timeout
    ) -> JsonObject:
        """:meth:`request` for a call whose answer is a JSON object."""
        data = await self.request(method, path, json=json, params=params, timeout=timeout)
        return _object(data, path)

    async def _list(self, method: str, path: str, *, json: Any = None) -> list[JsonObject]:
        """:meth:`request` for a call whose answer is a list of JSON objects."""
        return _objects(await self.request(method, path, json=json), path)

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
        http: httpx.AsyncClient | None = None,
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
        http: httpx.AsyncClient | None = None,
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
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await self.http.get(self.base_url + "/v1/me/export", headers=headers)
        if resp.status_code >= 300:
            raise ApiError.from_response(resp.status_code, resp.content)
        data: JsonObject = orjson.loads(resp.content)
        return data

    async def delete_account(self, password: str) -> None:
        """Delete my account: every token of mine dies, this one too."""
        await self.request("DELETE", "/v1/me", json={"password": password})

    async def register_push(self, app_id: str, pushkey: str, platform: str) -> None:
        """Tie a push registration to this session (replacing its registration)."""
        body = {"app_id": app_id, "pushkey": pushkey, "platform": platform}
        await self.request("PUT", "/v1/push/registration", json=body)

    async def unregister_push(self) -> None:
        """Remove this session's push registration (204 when it had none)."""
        await self.request("DELETE", "/v1/push/registration")

    # -- uploads -----------------------------------------------------------------------
    async def upload(self, data: bytes, content_type: str, filename: str | None = None) -> str:
        """Upload bytes for a picture or file message: ask for a presigned PUT, send the
        bytes straight to the object store, return the ``upload_id`` to send."""
        ticket = await self._ticket(content_type, len(data), filename)
        await self._put(ticket, data)
        return str(ticket["upload_id"])

    async def upload_file(
        self,
        path: str | os.PathLike[str],
        content_type: str,
        filename: str | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> str:
        """:meth:`upload` of a file on disk, streamed in chunks (a large file is never
        held in memory). The server is asked first, with the file's size, so one over
        the limit is refused (``too_large``) before a byte is read. ``on_progress(sent,
        total)`` after each chunk."""
        size = os.stat(path).st_size
        ticket = await self._ticket(content_type, size, filename or os.path.basename(path))

        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            with open(path, "rb") as f:  # noqa: ASYNC230 - chunks of 256 KiB from a local disk
                while sent < size and (chunk := f.read(min(UPLOAD_CHUNK, size - sent))):
                    sent += len(chunk)
                    yield chunk
                    if on_progress is not None:
                        on_progress(sent, size)
            if sent != size:
                raise OSError(f"{path} changed while it was uploaded")

        # the length is known: a presigned PUT takes no chunked transfer encoding
        await self._put(ticket, chunks(), {"Content-Length": str(size)})
        return str(ticket["upload_id"])

    async def _ticket(self, content_type: str, size: int, filename: str | None) -> JsonObject:
        body: dict[str, Any] = {"content_type": content_type, "size": size}
        if filename is not None:
            body["filename"] = filename
        return await self._obj("POST", "/v1/uploads", json=body)

    async def _put(
        self,
        ticket: JsonObject,
        content: bytes | AsyncIterator[bytes],
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """The bytes to the presigned URL, with exactly the headers it was signed with."""
        resp = await self.http.request(
            str(ticket["method"]),
            str(ticket["url"]),
            content=content,
            headers={**dict(ticket["headers"]), **(extra or {})},
        )
        if resp.status_code >= 300:
            raise ApiError(
                resp.status_code, "upload_failed", f"the object store answered {resp.status_code}"
            )

    async def download(self, upload_id: str, thumbnail: bool = False) -> bytes:
        """The bytes of an upload I may see (its thumbnail with ``thumbnail``), through the
        server's redirect to a presigned URL."""
        path = f"/v1/uploads/{upload_id}" + ("/thumbnail" if thumbnail else "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        resp = await self.http.get(self.base_url + path, headers=headers, follow_redirects=True)
        if resp.status_code >= 300:
            raise ApiError.from_response(resp.status_code, resp.content)
        return resp.content

    async def push_registrations(self) -> list[JsonObject]:
        """Mine: ``[{app_id, pushkey, platform, device_id}]``."""
        return await self._list("GET", "/v1/push/registrations")

    async def user(self, user_id: int) -> JsonObject:
        """A user's public profile, or ``{user_id, deleted: true}`` for a deleted one."""
        return await self._obj("GET", f"/v1/users/{user_id}")

    async def lookup_user(self, username: str) -> JsonObject:
        """``{user_id, username, display_name}`` of the user with that username."""
        return await self._obj("GET", "/v1/users/lookup", params={"username": username})

    # -- friends / blocks --------------------------------------------------------------
    async def request_friend(self, to_user_id: int, note: str | None = None) -> int:
        body: dict[str, Any] = {"to_user_id": to_user_id}
        if note is not None:
            body["note"] = note
        data = await self._obj("POST", "/v1/friends/requests", json=body)
        return int(data["request_id"])

    async def friend_requests(self) -> JsonObject:
        return await self._obj("GET", "/v1/friends/requests")

    async def accept_friend(self, request_id: int) -> str:
        data = await self._obj("POST", f"/v1/friends/requests/{request_id}/accept")
        return str(data["conv_id"])

    async def friends(self) -> list[JsonObject]:
        return await self._list("GET", "/v1/friends")

    async def remove_friend(self, user_id: int) -> None:
        await self.request("DELETE", f"/v1/friends/{user_id}")

    async def block(self, user_id: int) -> None:
        await self.request("PUT", f"/v1/blocks/{user_id}")

    async def unblock(self, user_id: int) -> None:
        await self.request("DELETE", f"/v1/blocks/{user_id}")

    async def blocks(self) -> list[int]:
        return [int(u) for u in await self.request("GET", "/v1/blocks")]

    # -- groups ------------------------------------------------------------------------
    async def create_group(self, name: str, member_ids: list[int]) -> JsonObject:
        body = {"name": name, "member_ids": member_ids}
        return await self._obj("POST", "/v1/groups", json=body)

    async def add_members(
        self, group_id: int, user_ids: list[int], with_history: bool = False
    ) -> JsonObject:
        body = {"user_ids": user_ids, "with_history": with_history}
        path = f"/v1/groups/{group_id}/members"
        data = await self.request("POST", path, json=body)
        return {} if data is None else _object(data, path)

    async def kick(self, group_id: int, user_id: int) -> None:
        await self.request("DELETE", f"/v1/groups/{group_id}/members/{user_id}")

    async def leave(self, group_id: int) -> None:
        await self.request("POST", f"/v1/groups/{group_id}/leave")

    async def set_role(self, group_id: int, user_id: int, role: str) -> JsonObject:
        """Make a member ``"admin"`` or ``"member"`` again (the owner only)."""
        return await self._obj(
            "PUT", f"/v1/groups/{group_id}/members/{user_id}/role", json={"role": role}
        )

    async def mute_member(self, group_id: int, user_id: int, until: int) -> None:
        """Mute a member until ``until`` (ms since the epoch); 0 lifts it (owner/admins)."""
        await self.request(
            "PUT", f"/v1/groups/{group_id}/members/{user_id}/mute", json={"until": until}
        )

    async def members(self, group_id: int) -> list[JsonObject]:
        return await self._list("GET", f"/v1/groups/{group_id}/members")

    # -- conversations -----------------------------------------------------------------
    async def conversations(self) -> list[JsonObject]:
        return await self._list("GET", "/v1/conversations")

    async def history(
        self,
        conv_id: str,
        begin: int | None = None,
        end: int | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> JsonObject:
        params = {"begin": begin, "end": end, "limit": limit, "order": order}
        return await self._obj("GET", conv_path(conv_id) + "/messages", params=params)

    async def search(
        self,
        q: str,
        conv_id: str | None = None,
        limit: int | None = None,
        before: str | None = None,
    ) -> JsonObject:
        """One page of ``GET /v1/search``: ``{results, next_before}``, newest first."""
        params = {"q": q, "conv_id": conv_id, "limit": limit, "before": before}
        return await self._obj("GET", "/v1/search", params=params)

    async def search_all(self, q: str, conv_id: str | None = None) -> list[JsonObject]:
        """Every result of a search, page after page."""
        out: list[JsonObject] = []
        before: str | None = None
        while True:
            page = await self.search(q, conv_id, limit=100, before=before)
            out.extend(page["results"])
            before = page["next_before"]
            if before is None:
                return out

    async def send_rest(
        self,
        conv_id: str,
        content: Any,
        content_type: str = "text",
        client_msg_id: str | None = None,
        *,
        mentions: list[int] | None = None,
        mention_all: bool = False,
        reply_to: int | None = None,
    ) -> JsonObject:
        """Send through REST; same pipeline and ack body as the WebSocket ``send``."""
        body = send_body(
            conv_id,
            content,
            content_type,
            client_msg_id,
            mentions=mentions,
            mention_all=mention_all,
            reply_to=reply_to,
        )
        return await self._obj("POST", conv_path(conv_id) + "/messages", json=body)

    async def read_rest(self, conv_id: str, seq: int) -> JsonObject:
        return await self._obj("POST", conv_path(conv_id) + "/read", json={"seq": seq})

    async def clear(self, conv_id: str) -> JsonObject:
        return await self._obj("POST", conv_path(conv_id) + "/clear")

    async def conversation_settings(
        self, conv_id: str, *, muted: bool | None = None, pinned: bool | None = None
    ) -> JsonObject:
        """Set my ``muted`` / ``pinned`` (left out: unchanged); answers all of them."""
        body = {k: v for k, v in (("muted", muted), ("pinned", pinned)) if v is not None}
        return await self._obj("PUT", conv_path(conv_id) + "/settings", json=body)

    async def hide(self, conv_id: str) -> None:
        await self.request("DELETE", conv_path(conv_id))

    async def recall(self, conv_id: str, seq: int) -> JsonObject:
        return await self._obj("POST", f"{conv_path(conv_id)}/messages/{seq}/recall")

    async def edit(self, conv_id: str, seq: int, content: Any) -> JsonObject:
        """Edit my message; ``content`` is the new content object, or a string for a
        text message's ``{"text": ...}``. Answers the ``edited`` body."""
        body = {"content": {"text": content} if isinstance(content, str) else content}
        return await self._obj("POST", f"{conv_path(conv_id)}/messages/{seq}/edit", json=body)

    def _reaction_path(self, conv_id: str, seq: int, emoji: str) -> str:
        return f"{conv_path(conv_id)}/messages/{seq}/reactions/{quote(emoji, safe='')}"

    async def react(self, conv_id: str, seq: int, emoji: str) -> None:
        """Put my reaction on a message (204, idempotent)."""
        await self.request("PUT", self._reaction_path(conv_id, seq, emoji))

    async def unreact(self, conv_id: str, seq: int, emoji: str) -> None:
        """Take my reaction back (204, idempotent)."""
        await self.request("DELETE", self._reaction_path(conv_id, seq, emoji))

    async def receipts(self, conv_id: str, seq: int) -> JsonObject:
        return await self._obj("GET", f"{conv_path(conv_id)}/messages/{seq}/receipts")

    async def presence(self, user_ids: list[int]) -> list[JsonObject]:
        """``[{user_id, online, last_seen}]`` (nulls for users whose presence I may not
        see); the ``presence`` event on a connection announces changes."""
        ids = ",".join(str(u) for u in user_ids)
        return await self._list("GET", f"/v1/presence?user_ids={ids}")

    async def unread(self) -> JsonObject:
        return await self._obj("GET", "/v1/unread")

    async def sync(
        self,
        since: int = 0,
        wait: float | None = None,
        limit: int | None = None,
        recent: int | None = None,
    ) -> JsonObject:
        """``/v1/sync``; a long poll (``wait``) gets a read timeout beyond the wait."""
        params = {"since": since, "wait": wait, "limit": limit, "recent": recent}
        timeout = None if not wait else float(wait) + 15.0
        return await self._obj("GET", "/v1/sync", params=params, timeout=timeout)

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
        if self._own_http:
            await self.http.aclose()
