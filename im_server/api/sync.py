"""GET /v1/sync: conversation states changed since a version, with a long poll."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.errors import bad_request
from im_server.services import sync

router = APIRouter(prefix="/v1", tags=["sync"], responses=ERRORS)


def _num(
    request: Request, name: str, default: float, lo: float, hi: float, *, integer: bool = True
) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, 10) if integer else float(raw)
    except ValueError:
        raise bad_request(f"{name} must be a number") from None
    if value != value or value < lo:  # NaN or too small
        raise bad_request(f"{name} must be at least {lo:g}")
    return min(value, hi)


@router.get(
    "/sync",
    summary="States changed after version `since` (oldest first), each with its newest messages",
    description=(
        "since=0 is the snapshot for a new device. wait=S long-polls up to S seconds (capped at 30) when "
        "nothing changed; the answer's version is then `since` itself. limit (default 100, at most 500) "
        "conversations, recent (default 20, at most 100) messages each."
    ),
)
async def get_sync(request: Request, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    since = int(_num(request, "since", 0, 0, 2**63 - 1))
    wait = _num(request, "wait", 0, 0, sync.WAIT_CAP_S, integer=False)
    limit = int(_num(request, "limit", 100, 1, 500))
    recent = int(_num(request, "recent", 20, 0, 100))
    return await sync.do_sync(ctx, caller.user_id, since, wait, limit, recent)
