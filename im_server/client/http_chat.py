"""People, groups and conversations: the REST calls of
:class:`~im_server.client.http.Client` that a chat makes (friends, groups, history, sends,
reads, edits, reactions, receipts, search, presence, unread, sync)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from im_server.client.http_base import ClientBase, object_of
from im_server.client.wire import JsonObject, conv_path, send_body


class ChatApi(ClientBase):
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

    async def decline_friend(self, request_id: int) -> None:
        await self.request("POST", f"/v1/friends/requests/{request_id}/decline")

    async def cancel_friend_request(self, request_id: int) -> None:
        await self.request("DELETE", f"/v1/friends/requests/{request_id}")

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
        return {} if data is None else object_of(data, path)

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
