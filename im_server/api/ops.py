"""Operations: /healthz (process up), /readyz (stores reachable), /metrics."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from im_server.api.deps import Ctx
from im_server.api.responses import Answer
from im_server.metrics_access import UNAUTHORIZED, bearer_ok

router = APIRouter(tags=["operations"])


class Alive(Answer):
    status: Literal["ok"]


class Readiness(Answer):
    status: Literal["ready", "unavailable"]
    postgres: bool
    redis: bool


@router.get("/healthz", summary="The process is up")
async def healthz() -> Alive:
    return Alive(status="ok")


@router.get(
    "/readyz",
    summary="200 while PostgreSQL and Redis are reachable, else 503",
    responses={503: {"model": Readiness, "description": "a store is unreachable"}},
)
async def readyz(ctx: Ctx, response: Response) -> Readiness:
    checks = await ctx.health.check()
    ok = all(checks.values())
    response.status_code = 200 if ok else 503
    return Readiness(
        status="ready" if ok else "unavailable", postgres=checks["postgres"], redis=checks["redis"]
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    description="With IM_METRICS_TOKEN set, only for `Authorization: Bearer <metrics token>`; "
    "with IM_METRICS_LISTEN set, served on that address instead (404 here).",
)
async def metrics(ctx: Ctx, request: Request) -> Response:
    settings = ctx.settings
    if settings.metrics_listen:
        raise HTTPException(404, "Not Found")
    token = settings.metrics_token
    if token is not None and not bearer_ok(
        request.headers.get("authorization"), token.get_secret_value()
    ):
        return Response(
            UNAUTHORIZED,
            status_code=401,
            media_type="application/json",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
