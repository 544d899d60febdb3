"""Groups: create, members."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.schemas import NewGroup
from im_server.services import groups

router = APIRouter(prefix="/v1/groups", tags=["groups"], responses=ERRORS)


@router.post("", status_code=201, summary="Create a group; the creator is its owner")
async def create_group(body: NewGroup, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await groups.do_create_group(ctx, caller.user_id, body.name, body.member_ids)


@router.get("/{group_id}/members", summary="The group's current members and roles")
async def members(group_id: int, caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await groups.list_members(ctx, caller.user_id, group_id)
