"""The server API's webhooks (scope ``webhooks``): register, list, delete, rotate the
secret, failed deliveries and their retry. See ``services/webhooks.py``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from im_server.api.deps import ERRORS, Ctx, Id
from im_server.api.parsing import StrictJsonRoute
from im_server.api.responses import (
    SecretRotated,
    WebhookCreated,
    WebhookDeliveries,
    WebhookInfo,
)
from im_server.api.schemas import NewWebhook
from im_server.api.server import IdemKey, idempotent, json_answer, scope_extra, scoped
from im_server.services import webhooks
from im_server.services.idempotency import Answer
from im_server.storage.apikeys import ApiKeyRow

WebhooksKey = Annotated[ApiKeyRow, Depends(scoped("webhooks"))]
STATUS_NAMES = {v: k for k, v in webhooks.STATUSES.items()}

router = APIRouter(
    prefix="/v1/server/webhooks", tags=["server"], responses=ERRORS, route_class=StrictJsonRoute
)


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    summary="Register a webhook: its URL and the event types it takes",
    openapi_extra=scope_extra("webhooks"),
)
async def create(
    body: NewWebhook, request: Request, key: WebhooksKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        made = await webhooks.create(ctx, body.url, body.events)
        return json_answer(201, WebhookCreated(webhook_id=made.webhook_id, secret=made.secret))

    return await idempotent(ctx, key, request, idem, body, work)


@router.get(
    "",
    response_model=list[WebhookInfo],
    summary="The registered webhooks (never their secrets)",
    openapi_extra=scope_extra("webhooks"),
)
async def listed(key: WebhooksKey, ctx: Ctx) -> list[dict[str, Any]]:
    return [
        {
            "webhook_id": w.webhook_id,
            "url": w.url,
            "events": list(w.events),
            "created_at": w.created_at,
        }
        for w in await webhooks.listed(ctx)
    ]


@router.delete(
    "/{webhook_id}",
    status_code=204,
    summary="Delete a webhook (its pending deliveries with it)",
    openapi_extra=scope_extra("webhooks"),
)
async def delete(webhook_id: Id, key: WebhooksKey, ctx: Ctx) -> Response:
    await webhooks.delete(ctx, webhook_id)
    return Response(status_code=204)


@router.post(
    "/{webhook_id}/rotate-secret",
    response_model=SecretRotated,
    summary="A new secret; for 24 h both the old and the new one sign",
    openapi_extra=scope_extra("webhooks"),
)
async def rotate(
    webhook_id: Id, request: Request, key: WebhooksKey, ctx: Ctx, idem: IdemKey = None
) -> Response:
    async def work() -> Answer:
        return json_answer(200, SecretRotated(secret=await webhooks.rotate(ctx, webhook_id)))

    return await idempotent(ctx, key, request, idem, None, work)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=WebhookDeliveries,
    summary="The webhook's deliveries of a status (failed by default), newest first",
    openapi_extra=scope_extra("webhooks"),
)
async def deliveries(
    webhook_id: Id,
    key: WebhooksKey,
    ctx: Ctx,
    status: Annotated[str, Query(max_length=16)] = "failed",
) -> dict[str, Any]:
    rows = await webhooks.deliveries(ctx, webhook_id, status)
    return {
        "deliveries": [
            {
                "event_id": r.event_key,
                "type": r.type,
                "conv_key": r.conv_key,
                "status": STATUS_NAMES[r.status],
                "attempts": r.attempts,
                "created_at": r.created_at,
                "last_error": r.last_error,
            }
            for r in rows
        ]
    }


@router.post(
    "/{webhook_id}/deliveries/{event_id}/retry",
    status_code=204,
    summary="Send a failed delivery again (a new retry window)",
    openapi_extra=scope_extra("webhooks"),
)
async def retry(
    webhook_id: Id,
    event_id: Annotated[str, Path(max_length=256)],
    request: Request,
    key: WebhooksKey,
    ctx: Ctx,
    idem: IdemKey = None,
) -> Response:
    async def work() -> Answer:
        await webhooks.retry(ctx, webhook_id, event_id)
        return Answer(204, b"")

    return await idempotent(ctx, key, request, idem, None, work)
