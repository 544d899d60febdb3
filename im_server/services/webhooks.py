"""Webhooks of the app's servers: register, list, delete, rotate the secret, see and
retry failed deliveries. The deliveries themselves are ``workers/webhooks.py``; the
events are written where what they describe is committed (``storage/messages.py`` for
messages and notices, ``storage/webhooks.user_events`` for accounts)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from im_server import metrics
from im_server.context import Context
from im_server.errors import bad_request, not_found
from im_server.protocol import webhook_signing
from im_server.services import outbound
from im_server.storage import webhooks as store
from im_server.storage.db import now_ms
from im_server.storage.webhooks import DeliveryInfo, Webhook

log = logging.getLogger("im_server.webhooks")

EVENT_TYPES = (
    "message.created",
    "message.edited",
    "message.recalled",
    "member.added",
    "member.removed",
    "user.created",
    "user.deleted",
)
ROTATION_OVERLAP_MS = 86_400_000  # both secrets sign for a day after a rotation
LIST_MAX = 100


def check_events(events: list[str]) -> list[str]:
    if not events:
        raise bad_request('events: at least one type, or ["*"]')
    unknown = [e for e in events if e != "*" and e not in EVENT_TYPES]
    if unknown:
        raise bad_request(
            f"events: unknown type {unknown[0]!r:.60}; one of {', '.join(EVENT_TYPES)}"
        )
    return ["*"] if "*" in events else sorted(set(events))


@dataclass(slots=True, frozen=True)
class Created:
    webhook_id: int
    secret: str


async def create(ctx: Context, url: str, events: list[str]) -> Created:
    allow = ctx.settings.webhook_allow_private
    host, port = outbound.check_url(url, allow)
    await outbound.check_resolved(host, port, allow)
    kinds = check_events(events)
    secret = webhook_signing.new_secret()
    async with ctx.db.begin() as conn:
        webhook_id = await store.create(conn, url, kinds, secret, now_ms())
    log.info("webhook %d registered for %s", webhook_id, ",".join(kinds))
    return Created(webhook_id, secret)


async def listed(ctx: Context) -> list[Webhook]:
    async with ctx.db.connect() as conn:
        return await store.live(conn)


async def delete(ctx: Context, webhook_id: int) -> None:
    async with ctx.db.begin() as conn:
        if not await store.delete(conn, webhook_id, now_ms()):
            raise not_found("no such webhook")


async def rotate(ctx: Context, webhook_id: int) -> str:
    secret = webhook_signing.new_secret()
    async with ctx.db.begin() as conn:
        if not await store.rotate(conn, webhook_id, secret, now_ms() + ROTATION_OVERLAP_MS):
            raise not_found("no such webhook")
    return secret


STATUSES = {"failed": store.FAILED, "pending": store.PENDING, "delivered": store.DELIVERED}


async def deliveries(ctx: Context, webhook_id: int, status: str) -> list[DeliveryInfo]:
    if status not in STATUSES:
        raise bad_request("status: failed, pending or delivered")
    async with ctx.db.connect() as conn:
        if not await store.exists(conn, webhook_id):
            raise not_found("no such webhook")
        return await store.deliveries(conn, webhook_id, STATUSES[status], LIST_MAX)


async def retry(ctx: Context, webhook_id: int, event_key: str) -> None:
    async with ctx.db.begin() as conn:
        if not await store.exists(conn, webhook_id):
            raise not_found("no such webhook")
        if not await store.retry(conn, webhook_id, event_key, now_ms()):
            raise not_found("no failed delivery of that webhook-id")
    ctx.webhooks_due.set()


DELIVERED_KEPT_MS = 86_400_000  # delivered rows are kept a day (GET ...?status=delivered)


async def report_depths(ctx: Context) -> None:
    """Each webhook's pending deliveries and how old the oldest is (``/metrics``), and
    the prune of delivered rows after a day and failed ones a week after the window."""
    now = now_ms()
    async with ctx.db.connect() as conn:
        found = await store.depths(conn)
    for webhook_id, (n, oldest) in found.items():
        metrics.WEBHOOK_DEPTH.labels(str(webhook_id)).set(n)
        age = (now - oldest) / 1000 if oldest is not None else 0.0
        metrics.WEBHOOK_OLDEST.labels(str(webhook_id)).set(max(age, 0.0))
    window = int(ctx.settings.webhook_retry_hours * 3_600_000)
    async with ctx.db.begin() as conn:
        await store.prune(conn, now - DELIVERED_KEPT_MS, now - window - 7 * DELIVERED_KEPT_MS)
