"""Presence of friends."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import Presence
from im_server.services import presence

router = APIRouter(
    prefix="/v1/presence", tags=["friends"], responses=ERRORS, route_class=StrictJsonRoute
)


@router.get(
    "",
    response_model=list[Presence],
    summary="Whether each user is online, and when last seen (friends only)",
    description=(
        f"Query: user_ids, 1-{presence.MAX_USER_IDS} comma-separated ids. One entry per "
        "distinct id, in the order given; online and last_seen are null for a user who is "
        "not my friend (or whom I removed, who removed me, or a block either way)."
    ),
)
async def get_presence(
    caller: CurrentUser,
    ctx: Ctx,
    user_ids: Annotated[str, Query(min_length=1, max_length=presence.MAX_QUERY_CHARS)],
) -> list[dict[str, Any]]:
    return await presence.presence(ctx, caller.user_id, user_ids)
