"""Groups: create, members."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import GroupCreated, GroupMember, MembersAdded, RoleSet
from im_server.api.schemas import AddMembers, MuteBody, NewGroup, RoleBody
from im_server.services import groups

router = APIRouter(
    prefix="/v1/groups", tags=["groups"], responses=ERRORS, route_class=StrictJsonRoute
)


@router.post(
    "",
    status_code=201,
    response_model=GroupCreated,
    summary="Create a group; the creator is its owner",
)
async def create_group(body: NewGroup, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await groups.do_create_group(ctx, caller.user_id, body.name, body.member_ids)


@router.get(
    "/{group_id}/members",
    response_model=list[GroupMember],
    summary="The group's current members and roles",
)
async def members(group_id: Id, caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await groups.list_members(ctx, caller.user_id, group_id)


@router.post(
    "/{group_id}/members",
    response_model=MembersAdded,
    summary="Add members, with or without history (owner/admins)",
)
async def add_members(
    group_id: Id, body: AddMembers, caller: CurrentUser, ctx: Ctx
) -> dict[str, Any]:
    return await groups.do_add_members(
        ctx, caller.user_id, group_id, body.user_ids, body.with_history
    )


@router.delete(
    "/{group_id}/members/{user_id}", status_code=204, summary="Kick a member (owner/admins)"
)
async def kick(group_id: Id, user_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await groups.do_kick(ctx, caller.user_id, group_id, user_id)
    return Response(status_code=204)


@router.post(
    "/{group_id}/leave", status_code=204, summary="Leave the group (an owner hands over first)"
)
async def leave(group_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await groups.do_leave(ctx, caller.user_id, group_id)
    return Response(status_code=204)


@router.put(
    "/{group_id}/members/{user_id}/mute",
    status_code=204,
    summary="Mute a member until a time, or lift it with 0 (owner/admins)",
)
async def mute(
    group_id: Id, user_id: Id, body: MuteBody, caller: CurrentUser, ctx: Ctx
) -> Response:
    await groups.do_mute(ctx, caller.user_id, group_id, user_id, body.until)
    return Response(status_code=204)


@router.put(
    "/{group_id}/members/{user_id}/role",
    response_model=RoleSet,
    summary="Make a member admin or member again (owner only)",
)
async def set_role(
    group_id: Id, user_id: Id, body: RoleBody, caller: CurrentUser, ctx: Ctx
) -> dict[str, Any]:
    return await groups.do_set_role(ctx, caller.user_id, group_id, user_id, body.role)
