"""Search over the messages I can see."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute, query_uint
from im_server.api.responses import SearchPage
from im_server.protocol.ids import parse_conv_id
from im_server.services import search

router = APIRouter(prefix="/v1", tags=["search"], responses=ERRORS, route_class=StrictJsonRoute)

LIMIT_DEFAULT = 20
LIMIT_MAX = 100


@router.get(
    "/search",
    response_model=SearchPage,
    summary="Search the messages I can see, newest first",
    description=(
        "Query: q (required, non-blank, at most 256 characters), conv_id (one conversation), "
        "limit (default 20, at most 100), before (a next_before). Words match whole or as "
        "prefixes; Chinese, Japanese and Korean text by any substring of two or more "
        "characters. My windows apply as in history; recalled messages are left out."
    ),
)
async def search_messages(request: Request, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    params = request.query_params
    raw_conv = params.get("conv_id")
    ref = parse_conv_id(raw_conv) if raw_conv is not None else None
    limit = min(query_uint(request, "limit", minimum=1) or LIMIT_DEFAULT, LIMIT_MAX)
    return await search.search(
        ctx, caller.user_id, params.get("q"), ref, limit, params.get("before")
    )
