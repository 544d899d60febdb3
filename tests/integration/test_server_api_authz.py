"""The authorization matrix of the server API: every route under ``/v1/server/`` (and
the bots' route) against a missing key, a key without the route's scope, a user token
sent as a key or as a bearer token, and a revoked key. Each refused write is followed by
a check that it changed nothing."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from im_server.client import ApiError, ServerClient
from im_server.client.transport import request_sync
from im_server.services import apikeys
from tests.support import Stores, api_key, eventually, new_user, pg

RUN = uuid.uuid4().hex[:8]
TARGET = f"authz-{RUN}"  # an existing user every call names
NEW = f"authz-new-{RUN}"  # a user no refused call may create
WEBHOOK = 2**40  # the calls are refused before anyone looks for it


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    scope: str
    body: Any = None


def routes(group_id: int) -> list[Route]:
    return [
        Route("PUT", f"/v1/server/users/{NEW}", "users", {"display_name": "x"}),
        Route("POST", "/v1/server/users/import", "users", {"users": [{"external_id": NEW}]}),
        Route("GET", f"/v1/server/users/{TARGET}", "users"),
        Route("DELETE", f"/v1/server/users/{TARGET}", "users"),
        Route("POST", f"/v1/server/users/{TARGET}/tokens", "users", {}),
        Route("POST", f"/v1/server/users/{TARGET}/revoke-tokens", "users"),
        Route("POST", "/v1/server/friendships", "users", {"a": TARGET, "b": f"{TARGET}-b"}),
        Route(
            "POST",
            "/v1/server/messages",
            "messages",
            {
                "from": TARGET,
                "conv_id": f"g:{group_id}",
                "client_msg_id": "authz",
                "content_type": "text",
                "content": {"text": "x"},
            },
        ),
        Route("POST", "/v1/server/groups", "groups", {"name": "g", "owner": TARGET, "members": []}),
        Route("PUT", f"/v1/server/groups/{group_id}/members/{TARGET}-b", "groups", {}),
        Route("DELETE", f"/v1/server/groups/{group_id}/members/{TARGET}-b", "groups"),
        Route(
            "POST",
            "/v1/server/webhooks",
            "webhooks",
            {"url": "https://hooks.example/x", "events": ["*"]},
        ),
        Route("GET", "/v1/server/webhooks", "webhooks"),
        Route("DELETE", f"/v1/server/webhooks/{WEBHOOK}", "webhooks"),
        Route("POST", f"/v1/server/webhooks/{WEBHOOK}/rotate-secret", "webhooks"),
        Route("GET", f"/v1/server/webhooks/{WEBHOOK}/deliveries?status=failed", "webhooks"),
        Route("POST", f"/v1/server/webhooks/{WEBHOOK}/deliveries/msg_x/retry", "webhooks"),
    ]


def other_scope(scope: str) -> str:
    return {"users": "messages", "messages": "groups", "groups": "webhooks", "webhooks": "users"}[
        scope
    ]


async def _state(stores: Stores) -> tuple[Any, ...]:
    """What any of the calls would change."""
    async with pg(stores) as conn:
        return (
            await conn.fetchval(
                "SELECT count(*) FROM users WHERE external_id LIKE $1", f"authz-%{RUN}%"
            ),
            await conn.fetchval(
                "SELECT count(*) FROM users WHERE external_id = $1 AND deleted_at IS NULL", TARGET
            ),
            await conn.fetchval(
                "SELECT count(*) FROM sessions s JOIN users u USING (user_id) "
                "WHERE u.external_id = $1",
                TARGET,
            ),
            await conn.fetchval(
                "SELECT tokens_valid_after FROM users WHERE external_id = $1 "
                "AND deleted_at IS NULL",
                TARGET,
            ),
            await conn.fetchval("SELECT count(*) FROM groups"),
            await conn.fetchval("SELECT count(*) FROM friendships"),
            await conn.fetchval("SELECT count(*) FROM conv_members"),
            tuple(await conn.fetchrow("SELECT count(*), max(secret) FROM webhooks")),
        )


async def test_every_server_route_refuses_the_wrong_caller(url: str, stores: Stores) -> None:
    async with ServerClient(url, await api_key(stores)) as app:
        await app.import_users([{"external_id": TARGET}, {"external_id": f"{TARGET}-b"}])
        group = await app.create_group("authz", TARGET, [f"{TARGET}-b"])
    user = await new_user(url)
    revoked_name = f"revoked{RUN}"
    revoked = await api_key(stores, ["all"], revoked_name)
    from im_server.config import load_settings
    from im_server.storage.db import create_engine

    db = create_engine(load_settings(database_url=stores.pg.url, db_pool_size=1))
    try:
        assert await apikeys.revoke(db, revoked_name)
    finally:
        await db.dispose()
    scoped = {
        s: await api_key(stores, [other_scope(s)])
        for s in ("users", "messages", "groups", "webhooks")
    }
    before = await _state(stores)
    checked = 0
    for route in routes(group["group_id"]):
        actors: dict[str, tuple[dict[str, str], int]] = {
            "no key": ({}, 401),
            "user token as key": ({"X-Api-Key": user.token or ""}, 401),
            "user token as bearer": ({"Authorization": f"Bearer {user.token}"}, 401),
            "revoked key": ({"X-Api-Key": revoked}, 401),
            "garbage key": ({"X-Api-Key": "imk_" + "A" * 43}, 401),
            "wrong scope": ({"X-Api-Key": scoped[route.scope]}, 403),
        }
        for actor, (headers, status) in actors.items():
            r = await asyncio.to_thread(
                request_sync, route.method, url + route.path, json=route.body, headers=headers
            )
            assert r.status_code == status, (route, actor, r.text)
            code = {401: "unauthorized", 403: "forbidden"}[status]
            assert r.json()["error"]["code"] == code
            checked += 1
    assert checked == len(routes(0)) * 6
    assert await _state(stores) == before


async def test_the_bot_route_takes_a_user_token_only(url: str, stores: Stores) -> None:
    key = await api_key(stores)
    async with ServerClient(url, key) as app:
        bot = await app.put_user(f"authz-bot-{RUN}", kind="bot")
    path = f"{url}/v1/bots/{bot['user_id']}/chat"
    for headers in ({}, {"X-Api-Key": key}, {"Authorization": f"Bearer {key}"}):
        r = request_sync("POST", path, headers=headers)
        assert r.status_code == 401, headers
    c = await new_user(url)
    await c.request("POST", f"/v1/bots/{bot['user_id']}/chat")
    with pytest.raises(ApiError) as err:
        await c.request("POST", f"/v1/bots/{c.user_id}/chat")
    assert err.value.status == 400


async def test_a_revoked_key_stops_within_seconds(url: str, stores: Stores) -> None:
    name = f"soon{RUN}"
    key = await api_key(stores, ["users"], name)
    async with ServerClient(url, key) as app:
        await app.put_user(f"authz-soon-{RUN}")  # cached as live now
        from im_server.config import load_settings
        from im_server.storage.db import create_engine

        db = create_engine(load_settings(database_url=stores.pg.url, db_pool_size=1))
        try:
            assert await apikeys.revoke(db, name)
        finally:
            await db.dispose()

        async def refused() -> bool:
            try:
                await app.get_user(f"authz-soon-{RUN}")
            except ApiError as e:
                return e.status == 401
            return False

        await eventually(refused, timeout=8)
