"""The server API's client, for the app's servers (async, ``X-Api-Key``).

The same transport and error type as :class:`~im_server.client.Client`: any non-2xx
answer raises :class:`~im_server.client.errors.ApiError` with the contract's ``code``.
Every write takes an optional ``idempotency_key``: a retry with the same key and request
changes nothing twice and gets the first answer.

    async with ServerClient("http://127.0.0.1:8000", api_key) as app:
        await app.import_users([{"external_id": "u-1", "display_name": "Ann"}])
        token = (await app.mint_token("u-1", device_id="web"))["token"]
        bot = await app.put_user("helper-bot", display_name="Helper", kind="bot")
        await app.send_message("helper-bot", conv_id, "hello-1", {"text": "hi"})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self
from urllib.parse import quote

from im_server.client.errors import ApiError
from im_server.client.http_base import decoded, object_of
from im_server.client.transport import HttpPool
from im_server.client.wire import JsonObject


class ServerClient:
    def __init__(self, base_url: str, api_key: str, *, http: HttpPool | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._own_http = http is None
        self.http = http or HttpPool(timeout=60.0, connect_timeout=10.0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One call; the decoded JSON body (None for 204), :class:`ApiError` otherwise."""
        h = {"X-Api-Key": self.api_key, **(headers or {})}
        if idempotency_key is not None:
            h["Idempotency-Key"] = idempotency_key
        return decoded(await self.http.request(method, self.base_url + path, json=json, headers=h))

    async def _obj(self, method: str, path: str, **kw: Any) -> JsonObject:
        return object_of(await self.request(method, path, **kw), path)

    # -- users -----------------------------------------------------------------------------
    async def put_user(
        self,
        external_id: str,
        *,
        display_name: str | None = None,
        kind: str | None = None,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        body = {k: v for k, v in (("display_name", display_name), ("kind", kind)) if v}
        return await self._obj(
            "PUT", _user(external_id), json=body, idempotency_key=idempotency_key
        )

    async def import_users(
        self, users: Sequence[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> list[JsonObject]:
        data = await self._obj(
            "POST",
            "/v1/server/users/import",
            json={"users": list(users)},
            idempotency_key=idempotency_key,
        )
        out: list[JsonObject] = data["users"]
        return out

    async def get_user(self, external_id: str) -> JsonObject:
        return await self._obj("GET", _user(external_id))

    async def delete_user(self, external_id: str) -> None:
        await self.request("DELETE", _user(external_id))

    async def mint_token(
        self,
        external_id: str,
        *,
        device_id: str | None = None,
        ttl_s: int | None = None,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        body = {k: v for k, v in (("device_id", device_id), ("ttl_s", ttl_s)) if v is not None}
        return await self._obj(
            "POST", _user(external_id) + "/tokens", json=body, idempotency_key=idempotency_key
        )

    async def revoke_tokens(self, external_id: str) -> None:
        await self.request("POST", _user(external_id) + "/revoke-tokens")

    async def befriend(self, a: str, b: str, *, idempotency_key: str | None = None) -> str:
        data = await self._obj(
            "POST",
            "/v1/server/friendships",
            json={"a": a, "b": b},
            idempotency_key=idempotency_key,
        )
        return str(data["conv_id"])

    # -- messages and groups ---------------------------------------------------------------
    async def send_message(
        self,
        sender: str,
        conv_id: str,
        client_msg_id: str,
        content: Mapping[str, Any],
        *,
        content_type: str = "text",
        mentions: Sequence[int] = (),
        reply_to: int | None = None,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        """Send as ``sender`` (an external id); the send's ack."""
        body: dict[str, Any] = {
            "from": sender,
            "conv_id": conv_id,
            "client_msg_id": client_msg_id,
            "content_type": content_type,
            "content": dict(content),
        }
        if mentions:
            body["mentions"] = list(mentions)
        if reply_to is not None:
            body["reply_to"] = reply_to
        return await self._obj(
            "POST", "/v1/server/messages", json=body, idempotency_key=idempotency_key
        )

    async def create_group(
        self,
        name: str,
        owner: str,
        members: Sequence[str] = (),
        *,
        idempotency_key: str | None = None,
    ) -> JsonObject:
        return await self._obj(
            "POST",
            "/v1/server/groups",
            json={"name": name, "owner": owner, "members": list(members)},
            idempotency_key=idempotency_key,
        )

    async def add_member(
        self, group_id: int, external_id: str, *, with_history: bool = False
    ) -> None:
        await self.request(
            "PUT",
            f"/v1/server/groups/{group_id}/members/{quote(external_id, safe='')}",
            json={"with_history": with_history},
        )

    async def remove_member(self, group_id: int, external_id: str) -> None:
        await self.request(
            "DELETE", f"/v1/server/groups/{group_id}/members/{quote(external_id, safe='')}"
        )

    # -- webhooks --------------------------------------------------------------------------
    async def create_webhook(
        self, url: str, events: Sequence[str] = ("*",), *, idempotency_key: str | None = None
    ) -> JsonObject:
        """A webhook: ``{webhook_id, secret}`` (the secret is shown only here)."""
        return await self._obj(
            "POST",
            "/v1/server/webhooks",
            json={"url": url, "events": list(events)},
            idempotency_key=idempotency_key,
        )

    async def webhooks(self) -> list[JsonObject]:
        out: list[JsonObject] = await self.request("GET", "/v1/server/webhooks")
        return out

    async def delete_webhook(self, webhook_id: int) -> None:
        await self.request("DELETE", f"/v1/server/webhooks/{webhook_id}")

    async def rotate_webhook_secret(self, webhook_id: int) -> str:
        data = await self._obj("POST", f"/v1/server/webhooks/{webhook_id}/rotate-secret")
        return str(data["secret"])

    async def webhook_deliveries(self, webhook_id: int, status: str = "failed") -> list[JsonObject]:
        data = await self._obj(
            "GET", f"/v1/server/webhooks/{webhook_id}/deliveries?status={quote(status)}"
        )
        out: list[JsonObject] = data["deliveries"]
        return out

    async def retry_delivery(self, webhook_id: int, event_id: str) -> None:
        await self.request(
            "POST",
            f"/v1/server/webhooks/{webhook_id}/deliveries/{quote(event_id, safe='')}/retry",
        )


def _user(external_id: str) -> str:
    return f"/v1/server/users/{quote(external_id, safe='')}"


__all__ = ["ApiError", "ServerClient"]
