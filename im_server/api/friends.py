"""Friends: requests, accept, list."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import Conversation, Friend, FriendRequests, FriendRequestSent
from im_server.api.schemas import FriendRequestBody
from im_server.services import contacts

router = APIRouter(
    prefix="/v1/friends", tags=["friends"], responses=ERRORS, route_class=StrictJsonRoute
)


@router.post(
    "/requests",
    status_code=201,
    response_model=FriendRequestSent,
    response_model_exclude_none=True,
    summary="Ask someone to be friends (accepts their pending request to you)",
)
async def request_friend(body: FriendRequestBody, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await contacts.do_request_friend(ctx, caller.user_id, body.to_user_id, body.note)


@router.get(
    "/requests", response_model=FriendRequests, summary="Pending requests, to me and from me"
)
async def list_requests(caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await contacts.requests(ctx, caller.user_id)


@router.post(
    "/requests/{request_id}/accept",
    response_model=Conversation,
    summary="Accept a request: the single chat's conv_id",
)
async def accept(request_id: Id, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await contacts.do_accept(ctx, caller.user_id, request_id)


@router.post(
    "/requests/{request_id}/decline",
    status_code=204,
    summary="Decline a request to me (its sender is not told)",
)
async def decline(request_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await contacts.do_decline(ctx, caller.user_id, request_id)
    return Response(status_code=204)


@router.delete("/requests/{request_id}", status_code=204, summary="Cancel a request I sent")
async def cancel(request_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await contacts.do_cancel(ctx, caller.user_id, request_id)
    return Response(status_code=204)


@router.get("", response_model=list[Friend], summary="My friends, without those I removed")
async def list_friends(caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await contacts.friends(ctx, caller.user_id)


@router.delete(
    "/{user_id}",
    status_code=204,
    summary="Remove a friend (one-sided: clears the chat on my side only)",
)
async def remove_friend(user_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await contacts.do_remove_friend(ctx, caller.user_id, user_id)
    return Response(status_code=204)


blocks_router = APIRouter(
    prefix="/v1/blocks", tags=["friends"], responses=ERRORS, route_class=StrictJsonRoute
)


@blocks_router.put(
    "/{user_id}", status_code=204, summary="Block a user: they can no longer send to me"
)
async def block(user_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await contacts.do_block(ctx, caller.user_id, user_id, True)
    return Response(status_code=204)


@blocks_router.delete("/{user_id}", status_code=204, summary="Unblock a user")
async def unblock(user_id: Id, caller: CurrentUser, ctx: Ctx) -> Response:
    await contacts.do_block(ctx, caller.user_id, user_id, False)
    return Response(status_code=204)


@blocks_router.get("", summary="The users I blocked")
async def list_blocks(caller: CurrentUser, ctx: Ctx) -> list[int]:
    return await contacts.blocks(ctx, caller.user_id)
