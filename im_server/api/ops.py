"""Operations: /healthz (process up), /readyz (stores reachable), /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from im_server.api.deps import Ctx

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="200 while PostgreSQL and Redis are reachable, else 503")
async def readyz(ctx: Ctx, response: Response) -> dict[str, object]:
    health = ctx.extra.get("health")
    checks = await health.check() if health else {"postgres": False, "redis": False}
    ok = all(checks.values())
    response.status_code = 200 if ok else 503
    return {"status": "ready" if ok else "unavailable", **checks}


@router.get("/metrics", summary="Prometheus metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
