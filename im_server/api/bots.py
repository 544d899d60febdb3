"""Bots: a chat with one needs no friend request."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from im_server.api.deps import ERRORS, Ctx, CurrentUser, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import Conversation
from im_server.services import bots

router = APIRouter(prefix="/v1/bots", tags=["bots"], responses=ERRORS, route_class=StrictJsonRoute)


@router.post(
    "/{user_id}/chat",
    response_model=Conversation,
    summary="Open my single chat with a bot (no friend request)",
)
async def open_chat(user_id: Id, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return {"conv_id": await bots.open_chat(ctx, caller.user_id, user_id)}
