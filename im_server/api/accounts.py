"""Accounts and sessions: register, log in, my sessions (list, revoke one, revoke all),
password change, /v1/me, user profiles and look-up by username."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from im_server.api.deps import ERRORS, Ctx, CurrentUser, Id, client_host
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import (
    PublicUser,
    Registered,
    SessionInfo,
    SessionToken,
    UserProfile,
)
from im_server.api.schemas import AccountDeletion, NewSession, NewUser, PasswordChange
from im_server.services import accounts, deletion, export, profiles

router = APIRouter(prefix="/v1", tags=["accounts"], responses=ERRORS, route_class=StrictJsonRoute)

# a device id in a path: bounded here, its characters checked like at login (400)
DevicePath = Annotated[str, Path(min_length=1, max_length=64)]


@router.post("/users", status_code=201, response_model=Registered, summary="Register a user")
async def register(body: NewUser, ctx: Ctx, request: Request) -> dict[str, Any]:
    return await accounts.do_register(
        ctx, body.username, body.password, body.display_name, client_host(request)
    )


@router.post(
    "/sessions",
    response_model=SessionToken,
    summary="Log in: a bearer token for this device (replaces the device's session)",
    responses={429: {"description": "rate_limited: too many failed logins"}},
)
async def login(body: NewSession, ctx: Ctx, request: Request) -> dict[str, Any]:
    return await accounts.do_login(
        ctx,
        body.username,
        body.password,
        body.device_id,
        client_host(request),
        body.device_name,
        request.headers.get("user-agent"),
    )


@router.get(
    "/sessions",
    response_model=list[SessionInfo],
    summary="My live sessions, one per device",
)
async def list_sessions(caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await accounts.sessions(ctx, caller.user_id, caller.token)


@router.delete(
    "/sessions", status_code=204, summary="Log out everywhere: revoke every session of mine"
)
async def logout_everywhere(caller: CurrentUser, ctx: Ctx) -> Response:
    await accounts.do_logout_everywhere(ctx, caller.user_id)
    return Response(status_code=204)


@router.delete(
    "/sessions/current", status_code=204, summary="Revoke this token (its sockets close with 4401)"
)
async def logout(caller: CurrentUser, ctx: Ctx) -> Response:
    await accounts.do_logout(ctx, caller.token)
    return Response(status_code=204)


@router.delete(
    "/sessions/{device_id}",
    status_code=204,
    summary="Revoke my session on that device (its sockets close with 4401)",
)
async def revoke_device(device_id: DevicePath, caller: CurrentUser, ctx: Ctx) -> Response:
    await accounts.do_revoke_device(ctx, caller.user_id, device_id)
    return Response(status_code=204)


@router.get("/me", response_model=PublicUser, summary="Who am I")
async def me(caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await profiles.me(ctx, caller.user_id)


@router.put(
    "/me/password",
    status_code=204,
    summary="Change my password; every other session of mine is revoked",
    responses={429: {"description": "rate_limited: too many failed password checks"}},
)
async def change_password(
    body: PasswordChange, caller: CurrentUser, ctx: Ctx, request: Request
) -> Response:
    await accounts.do_change_password(
        ctx,
        caller.user_id,
        caller.token,
        body.old_password,
        body.new_password,
        client_host(request),
    )
    return Response(status_code=204)


@router.get(
    "/me/export",
    summary="My data as one JSON document (profile, friends, blocks, groups, my messages)",
    responses={200: {"content": {"application/json": {}}}},
)
async def export_me(caller: CurrentUser, ctx: Ctx) -> StreamingResponse:
    head = await export.prepare(ctx, caller.user_id)
    return StreamingResponse(
        export.stream(ctx, caller.user_id, head),
        media_type="application/json",
        headers={"Content-Disposition": 'attachment; filename="export.json"'},
    )


@router.delete(
    "/me",
    status_code=204,
    summary="Delete my account: every session revoked, every group left, the username freed",
    responses={429: {"description": "rate_limited: too many failed password checks"}},
)
async def delete_account(
    body: AccountDeletion, caller: CurrentUser, ctx: Ctx, request: Request
) -> Response:
    await deletion.do_delete_account(ctx, caller.user_id, body.password, client_host(request))
    return Response(status_code=204)


@router.get(
    "/users/lookup",
    response_model=PublicUser,
    summary="Find a user by username (compared as at registration)",
)
async def lookup_user(
    username: Annotated[str, Query(min_length=1, max_length=256)],
    caller: CurrentUser,
    ctx: Ctx,
    request: Request,
) -> dict[str, Any]:
    return await profiles.lookup(ctx, caller.user_id, username, client_host(request))


@router.get(
    "/users/{user_id}",
    response_model=UserProfile,
    response_model_exclude_none=True,
    summary="A user's public profile (username, display name); {user_id, deleted} if deleted",
)
async def user_profile(
    user_id: Id, caller: CurrentUser, ctx: Ctx, request: Request
) -> dict[str, Any]:
    return await profiles.profile(ctx, caller.user_id, user_id, client_host(request))
