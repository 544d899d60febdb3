"""Accounts and sessions: POST /v1/users, POST /v1/sessions, DELETE /v1/sessions/current, GET /v1/me."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.schemas import NewSession, NewUser
from im_server.services import accounts

router = APIRouter(prefix="/v1", tags=["accounts"], responses=ERRORS, route_class=StrictJsonRoute)


@router.post("/users", status_code=201, summary="Register a user")
async def register(body: NewUser, ctx: Ctx) -> dict[str, Any]:
    return await accounts.do_register(ctx, body.username, body.password, body.display_name)


@router.post("/sessions", summary="Log in: a bearer token for this device")
async def login(body: NewSession, ctx: Ctx) -> dict[str, Any]:
    return await accounts.do_login(ctx, body.username, body.password, body.device_id)


@router.delete(
    "/sessions/current", status_code=204, summary="Revoke this token (its sockets close with 4401)"
)
async def logout(caller: CurrentUser, ctx: Ctx) -> Response:
    await accounts.do_logout(ctx, caller.token)
    return Response(status_code=204)


@router.get("/me", summary="Who am I")
async def me(caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await accounts.me(ctx, caller.user_id)


@router.get("/users/{user_id}", summary="A user's public profile (username, display name)")
async def user_profile(user_id: Id, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await accounts.profile(ctx, user_id)
