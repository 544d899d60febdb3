"""The server API: what the app's servers call, with ``X-Api-Key`` (never a user token).

Every route names the scope it needs; a call without a valid key is 401, without the
scope 403. Each call is logged with the key's name, never the key. Every ``POST`` and
``PUT`` takes an optional ``Idempotency-Key`` (``services/idempotency.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import BaseModel

from im_server.api.deps import ERRORS, Ctx, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import (
    AppUserInfo,
    AppUserWritten,
    Conversation,
    GroupCreated,
    MintedToken,
    UsersImported,
)
from im_server.api.schemas import (
    AppUserBody,
    Friendship,
    MintBody,
    ServerGroup,
    ServerMemberBody,
    ServerMessage,
    UsersImport,
)
from im_server.context import Context
from im_server.errors import ImError
from im_server.protocol.client_frames import SendFields
from im_server.protocol.server_frames import AckOk
from im_server.protocol.types import ExternalId
from im_server.services import apikeys, app_actions, app_users, idempotency
from im_server.services.app_users import NewAppUser
from im_server.services.idempotency import Answer, fingerprint
from im_server.storage.apikeys import ApiKeyRow

log = logging.getLogger("im_server.server_api")


def scoped(scope: str) -> Callable[[Request, Context], Awaitable[ApiKeyRow]]:
    async def check(request: Request, ctx: Ctx) -> ApiKeyRow:
        key = await apikeys.authenticate(ctx, request.headers.get("x-api-key"))
        if not apikeys.allows(key, scope):
            log.info(
                "key %r refused %s %s: no %r scope",
                key.name,
                request.method,
                request.url.path,
                scope,
            )
            raise ImError("forbidden", f"this API key lacks the {scope!r} scope")
        try:
            await ctx.rate.server_api.hold(key.key_id, "server API requests")
        except ImError:
            log.info("key %r over its rate: %s %s", key.name, request.method, request.url.path)
            raise
        log.info("key %r: %s %s", key.name, request.method, request.url.path)
        return key

    return check


UsersKey = Annotated[ApiKeyRow, Depends(scoped("users"))]
MessagesKey = Annotated[ApiKeyRow, Depends(scoped("messages"))]
GroupsKey = Annotated[ApiKeyRow, Depends(scoped("groups"))]
IdemKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="the same key and request within 24 h get the first answer again",
    ),
]


def scope_extra(scope: str) -> dict[str, Any]:
    """The route's OpenAPI extras: the key header, and the scope it needs (``x-scope``,
    read by ``scripts/gen_server_api_doc.py``)."""
    return {
        "parameters": [
            {"name": "X-Api-Key", "in": "header", "required": True, "schema": {"type": "string"}}
        ],
        "x-scope": scope,
    }


router = APIRouter(
    prefix="/v1/server", tags=["server"], responses=ERRORS, route_class=StrictJsonRoute
)


def json_answer(status: int, value: BaseModel | Any) -> Answer:
    body = value.model_dump_json().encode() if isinstance(value, BaseModel) else orjson.dumps(value)
    return Answer(status, body)


async def idempotent(
    ctx: Context,
    key: ApiKeyRow,
    request: Request,
    idem: str | None,
    body: BaseModel | None,
    work: Callable[[], Awaitable[Answer]],
) -> Response:
    raw = body.model_dump_json(by_alias=True).encode() if body is not None else b""
    h = fingerprint(request.method, request.url.path, raw)
    ans = await idempotency.once(ctx, key.key_id, idem, h, work)
    headers = {"Idempotent-Replayed": "true"} if ans.replayed else None
    if ans.status == 204:
        return Response(status_code=204, headers=headers)
    return Response(ans.body, ans.status, headers, media_type="application/json")


# -- users ----------------------------------------------------------------------------------


@router.put(
    "/users/{external_id}",
    response_model=AppUserWritten,
    summary="Create or update the user with this id of the app's",
    openapi_extra=scope_extra("users"),
)
async def put_user(
    external_id: ExternalId,
    body: AppUserBody,
    request: Request,
    key: UsersKey,
    ctx: Ctx,
    idem: IdemKey = None,
) -> Response:
    async def work() -> Answer:
        app_users.check_external_id(external_id)
        (u,) = await app_users.upsert(ctx, [NewAppUser(external_id, body.display_name, body.kind)])
        return json_answer(
            200, AppUserWritten(user_id=u.user_id, external_id=u.external_id, created=u.created)
        )

    return await idempotent(ctx, key, request, idem, body, work)


@router.post(
    "/users/import",
    response_model=UsersImported,
    summary="Create or update up to 10,000 users in one transaction",
    openapi_extra=scope_extra("users"),
)
async def import_users(
    body: UsersImport, request: Request, key: UsersKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        rows = await app_users.upsert(
            ctx, [NewAppUser(u.external_id, u.display_name, u.kind) for u in body.users]
        )
        return json_answer(
            200, {"users": [{"external_id": r.external_id, "user_id": r.user_id} for r in rows]}
        )

    return await idempotent(ctx, key, request, idem, body, work)


@router.get(
    "/users/{external_id}",
    response_model=AppUserInfo,
    summary="The user with this id of the app's",
    openapi_extra=scope_extra("users"),
)
async def get_user(external_id: ExternalId, key: UsersKey, ctx: Ctx) -> AppUserInfo:
    u = await app_users.get(ctx, external_id)
    return AppUserInfo.model_validate(
        {
            "user_id": u.user_id,
            "external_id": u.external_id,
            "display_name": u.display_name,
            "kind": u.kind,
        }
    )


@router.delete(
    "/users/{external_id}",
    status_code=204,
    summary="Delete the account (as DELETE /v1/me does, without a password)",
    openapi_extra=scope_extra("users"),
)
async def delete_user(external_id: ExternalId, key: UsersKey, ctx: Ctx) -> Response:
    await app_users.delete(ctx, external_id)
    return Response(status_code=204)


@router.post(
    "/users/{external_id}/tokens",
    response_model=MintedToken,
    summary="A session token for the user (listed and revocable like a login's)",
    openapi_extra=scope_extra("users"),
)
async def mint_token(
    external_id: ExternalId,
    request: Request,
    key: UsersKey,
    ctx: Ctx,
    body: MintBody | None = None,
    idem: IdemKey = None,
) -> Response:
    b = body or MintBody(device_id=None, ttl_s=None)

    async def work() -> Answer:
        m = await app_users.mint_token(ctx, external_id, b.device_id, b.ttl_s)
        return json_answer(
            200,
            MintedToken(
                token=m.token, user_id=m.user_id, device_id=m.device_id, expires_at=m.expires_at
            ),
        )

    return await idempotent(ctx, key, request, idem, b, work)


@router.post(
    "/users/{external_id}/revoke-tokens",
    status_code=204,
    summary="Every token of the user issued before now stops working; its sockets close",
    openapi_extra=scope_extra("users"),
)
async def revoke_tokens(
    external_id: ExternalId, request: Request, key: UsersKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        await app_users.revoke_tokens(ctx, external_id)
        return Answer(204, b"")

    return await idempotent(ctx, key, request, idem, None, work)


@router.post(
    "/friendships",
    response_model=Conversation,
    summary="Make two users friends at once (no request)",
    openapi_extra=scope_extra("users"),
)
async def befriend(
    body: Friendship, request: Request, key: UsersKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        return json_answer(200, {"conv_id": await app_actions.befriend(ctx, body.a, body.b)})

    return await idempotent(ctx, key, request, idem, body, work)


# -- messages -------------------------------------------------------------------------------


@router.post(
    "/messages",
    summary="Send as a user (the same pipeline, rules and dedupe as the user's own send)",
    openapi_extra=scope_extra("messages"),
)
async def send_message(
    body: ServerMessage, request: Request, key: MessagesKey, ctx: Ctx, idem: IdemKey = None
) -> AckOk:
    fields = SendFields.model_validate(body.model_dump(exclude={"sender", "conv_id"}))

    async def work() -> Answer:
        return json_answer(200, await app_actions.send_as(ctx, body.sender, body.conv_id, fields))

    return await idempotent(ctx, key, request, idem, body, work)  # type: ignore[return-value]


# -- groups ---------------------------------------------------------------------------------


@router.post(
    "/groups",
    status_code=201,
    response_model=GroupCreated,
    summary="Create a group with its owner and members",
    openapi_extra=scope_extra("groups"),
)
async def create_group(
    body: ServerGroup, request: Request, key: GroupsKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        made = await app_actions.create_group(ctx, body.name, body.owner, body.members)
        return json_answer(201, made)

    return await idempotent(ctx, key, request, idem, body, work)


@router.put(
    "/groups/{group_id}/members/{external_id}",
    status_code=204,
    summary="Add a member (as the owner would; a member already in: nothing changes)",
    openapi_extra=scope_extra("groups"),
)
async def add_member(
    group_id: Id,
    external_id: ExternalId,
    request: Request,
    key: GroupsKey,
    ctx: Ctx,
    body: ServerMemberBody | None = None,
    idem: IdemKey = None,
) -> Response:
    b = body or ServerMemberBody()

    async def work() -> Answer:
        await app_actions.add_member(ctx, group_id, external_id, b.with_history)
        return Answer(204, b"")

    return await idempotent(ctx, key, request, idem, b, work)


@router.delete(
    "/groups/{group_id}/members/{external_id}",
    status_code=204,
    summary="Remove a member (a kick; the owner leaves, handing ownership on)",
    openapi_extra=scope_extra("groups"),
)
async def remove_member(
    group_id: Id, external_id: ExternalId, key: GroupsKey, ctx: Ctx
) -> Response:
    await app_actions.remove_member(ctx, group_id, external_id)
    return Response(status_code=204)
