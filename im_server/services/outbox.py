"""Notices driven from durable state. A change that announces itself with a server-made
message (a reaction, a membership change) writes the notice into the outbox inside its
own transaction; after the commit the request sends it and deletes the row. If the
process dies in between, or a store fails, the row stays and the sweep of any process
sends it later, so a committed change always reaches the seq stream. A row keeps the
client_msg_id (``<type>-<32 hex>``) chosen when it was written: the request and a sweep
sending the same row get the same seq, never two."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, is_store_error
from im_server.protocol.ids import parse_conv_id
from im_server.services import send
from im_server.storage import outbox
from im_server.storage.db import now_ms
from im_server.storage.outbox import OutboxRow

log = logging.getLogger("im_server.outbox")

SWEEP_BATCH = 100


async def emit(
    conn: AsyncConnection, actor_id: int, conv_id: str, ctype: str, content: dict[str, Any]
) -> OutboxRow:
    """Write the notice in the caller's transaction; pass the row to ``deliver`` after
    the commit."""
    cmid = f"{ctype}-{uuid.uuid4().hex}"
    return await outbox.add(conn, conv_id, actor_id, cmid, ctype, orjson.dumps(content).decode())


def _store_down(e: Exception) -> bool:
    """A failure that a later attempt can get past: a store down or timing out."""
    if isinstance(e, ImError):
        return e.code == "unavailable"
    return is_store_error(e)


async def _send(ctx: Context, row: OutboxRow) -> None:
    """Send one notice. A refusal that no retry can change (a bug: notices skip the
    member checks) is logged and the row given up, so it cannot block the ones after."""
    try:
        await send.do_send(
            ctx,
            row.actor_id,
            parse_conv_id(row.conv_id),
            row.client_msg_id,
            row.content_type,
            row.content,
            skip_perm=True,
        )
    except ImError as e:
        if e.code == "unavailable":
            raise
        metrics.OUTBOX_REFUSED.inc()
        log.error("notice %d to %s refused (%s): dropped", row.id, row.conv_id, e.code)


async def deliver(ctx: Context, rows: list[OutboxRow]) -> None:
    """Send committed notices now. A store failure leaves them for the sweep (the change
    itself is committed, so the request still succeeds)."""
    try:
        for row in rows:
            await _send(ctx, row)
        async with ctx.db.begin() as conn:
            await outbox.delete(conn, [r.id for r in rows])
    except Exception as e:
        if not _store_down(e):
            raise
        metrics.OUTBOX_DEFERRED.inc(len(rows))
        log.warning("notice send deferred to the outbox sweep: %r", e)


async def sweep(ctx: Context) -> int:
    """Send the notices left behind for longer than the grace period (their requests died
    or failed), oldest first; returns how many were sent. The rows stay locked until
    they are deleted, so a concurrent sweep skips them."""
    grace_ms = int(ctx.settings.outbox_sweep_seconds * 1000)
    sent = 0
    while True:
        try:
            async with ctx.db.begin() as conn:
                rows = await outbox.due(conn, now_ms() - grace_ms, SWEEP_BATCH)
                for row in rows:
                    await _send(ctx, row)
                await outbox.delete(conn, [r.id for r in rows])
        except Exception as e:
            if not _store_down(e):
                raise
            log.warning("outbox sweep: %r; next run retries", e)
            return sent
        sent += len(rows)
        metrics.OUTBOX_SWEPT.inc(len(rows))
        if len(rows) < SWEEP_BATCH:
            return sent
