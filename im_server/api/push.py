"""Push registrations of my sessions (a phone's APNs or FCM address)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import PushConfig, PushRegistration
from im_server.api.schemas import PushRegistrationBody
from im_server.services import push_registrations

router = APIRouter(prefix="/v1/push", tags=["push"], responses=ERRORS, route_class=StrictJsonRoute)


@router.put(
    "/registration",
    status_code=204,
    summary="Tie a push registration to this session (replaces its registration)",
    description=(
        "The same (app_id, pushkey) registered by another session before is moved here: "
        "the newest registration wins. A revoked or expired session's registration is gone."
    ),
    responses={409: {"description": "conflict: too many push registrations"}},
)
async def put_registration(body: PushRegistrationBody, caller: CurrentUser, ctx: Ctx) -> Response:
    await push_registrations.do_register(
        ctx, caller.token, body.app_id, body.pushkey, body.platform, body.data
    )
    return Response(status_code=204)


@router.delete("/registration", status_code=204, summary="Remove this session's push registration")
async def delete_registration(caller: CurrentUser, ctx: Ctx) -> Response:
    await push_registrations.do_unregister(ctx, caller.token)
    return Response(status_code=204)


@router.get(
    "/config",
    response_model=PushConfig,
    response_model_exclude_none=True,
    summary="What a browser needs to subscribe to Web Push ({} when it is not configured)",
)
async def push_config(caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return push_registrations.push_config(ctx)


@router.get(
    "/registrations",
    response_model=list[PushRegistration],
    summary="My push registrations, one per session that has one",
)
async def list_registrations(caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await push_registrations.registrations(ctx, caller.user_id)
