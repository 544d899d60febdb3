"""GET /v1/sync: conversation states changed since a version, with a long poll."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute, query_decimal, query_uint
from im_server.api.responses import SyncPage
from im_server.errors import bad_request
from im_server.services import sync

router = APIRouter(prefix="/v1", tags=["sync"], responses=ERRORS, route_class=StrictJsonRoute)


def _bounded(value: float | None, default: float, lo: float, hi: float, name: str) -> float:
    if value is None:
        return default
    if value < lo:
        raise bad_request(f"{name} must be at least {lo:g}")
    return min(value, hi)


@router.get(
    "/sync",
    response_model=SyncPage,
    summary="States changed after version `since` (oldest first), each with its newest messages",
    description=(
        "since=0 is the snapshot for a new device. wait=S long-polls up to S seconds (capped at 30) when "
        "nothing changed; the answer's version is then `since` itself. limit (default 100, at most 500) "
        "conversations, recent (default 20, at most 100) messages each."
    ),
)
async def get_sync(request: Request, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    since = query_uint(request, "since") or 0
    wait = _bounded(query_decimal(request, "wait"), 0, 0, sync.WAIT_CAP_S, "wait")
    limit = int(_bounded(query_uint(request, "limit"), 100, 1, 500, "limit"))
    recent = int(_bounded(query_uint(request, "recent"), 20, 0, 100, "recent"))
    return await sync.do_sync(ctx, caller.user_id, since, wait, limit, recent)
