"""The before-send hook: the app's rules on what is sent (``IM_BEFORE_SEND_URL``).

Every user message (WebSocket, REST, server API; never a notice) is shown to the hook
before it gets a seq. Its answer allows the message, rejects it (the ack is ``ok:
false, code: "rejected"`` with the hook's reason; no seq is used) or replaces its
content. The decision is kept in Redis per (sender, client_msg_id) for
``IM_BEFORE_SEND_REMEMBER_SECONDS``: a retry of the send gets the same decision without
a call, and of two copies of one send racing, the first decision kept is both's. No
usable answer (a timeout, an error, the circuit open) takes ``IM_BEFORE_SEND_FAILURE``:
``allow`` (the default) or ``reject`` (``unavailable``); such an outcome is not kept, so
a retry asks again."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from im_server import metrics
from im_server.context import Context
from im_server.protocol.client_frames import SendFields
from im_server.protocol.ids import ConvRef
from im_server.protocol.session import SendCmd
from im_server.services import send_checks
from im_server.storage import app_users
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.before_send")

REASON_MAX = 256


@dataclass(slots=True, frozen=True)
class Decision:
    action: Literal["allow", "reject", "replace", "unavailable"]
    reason: str = ""
    content: dict[str, Any] | None = None


ALLOW = Decision("allow")


def _encode(d: Decision) -> bytes:
    return orjson.dumps({"a": d.action, "r": d.reason, "c": d.content})


def _decode(raw: bytes) -> Decision:
    v = orjson.loads(raw)
    return Decision(v["a"], v.get("r") or "", v.get("c"))


def interpret(ctx: Context, answer: dict[str, Any]) -> Decision | None:
    """The hook's answer as a decision; None when it is not one (the failure policy)."""
    action = answer.get("action")
    if action == "allow":
        return ALLOW
    if action == "reject":
        reason = answer.get("reason")
        text = reason[:REASON_MAX] if isinstance(reason, str) and reason else "rejected"
        return Decision("reject", text)
    if action == "replace":
        content = answer.get("content")
        if not isinstance(content, dict):
            return None
        try:
            send_checks.encode_content(ctx, content)
        except Exception:  # noqa: BLE001 - an unstorable replacement is no answer
            return None
        return Decision("replace", content=content)
    return None


async def _external_id(ctx: Context, user_id: int) -> str | None:
    hit = ctx.external_ids.get(user_id)
    if hit is not None or user_id in ctx.external_ids:
        return hit
    async with ctx.db.connect() as conn:
        found = await app_users.external_id_of(conn, user_id)
    ctx.external_ids.put(user_id, found)
    return found


def _failed(ctx: Context, why: str) -> Decision:
    if ctx.settings.before_send_failure == "reject":
        metrics.BEFORE_SEND_DECISIONS.labels(f"{why}_reject").inc()
        return Decision("unavailable", "the before-send hook did not answer, try again")
    metrics.BEFORE_SEND_DECISIONS.labels(f"{why}_allow").inc()
    return ALLOW


async def decide(
    ctx: Context, sender_id: int, ref: ConvRef, fields: SendFields | SendCmd
) -> Decision:
    cmid = fields.client_msg_id
    hook = ctx.before_send
    kept = await (
        hook.reads.submit((sender_id, cmid))
        if hook.reads is not None
        else ctx.redis.send_decision(sender_id, cmid)
    )
    if kept is not None:
        metrics.BEFORE_SEND_DECISIONS.labels("remembered").inc()
        return _decode(kept)
    data: dict[str, Any] = {
        "conv_id": ref.conv_id,
        "sender_id": sender_id,
        "client_msg_id": cmid,
        "content_type": fields.content_type,
        "content": fields.content,
    }
    external = await _external_id(ctx, sender_id)
    if external is not None:
        data["external_id"] = external
    if fields.mentions:
        data["mentions"] = list(fields.mentions)
    if fields.reply_to is not None:
        data["reply_to"] = fields.reply_to
    body = orjson.dumps({"type": "message.before_send", "timestamp": now_ms(), "data": data})
    t0 = time.perf_counter()
    outcome, answer = await hook.ask(f"bs_{sender_id}_{cmid}", body)
    if outcome == "breaker_open":
        return _failed(ctx, "breaker_open")
    metrics.BEFORE_SEND_SECONDS.observe(time.perf_counter() - t0)
    decision = interpret(ctx, answer) if answer is not None else None
    if decision is None:
        return _failed(ctx, "failed")
    metrics.BEFORE_SEND_DECISIONS.labels(decision.action).inc()
    item = (sender_id, cmid, _encode(decision), ctx.settings.before_send_remember_seconds)
    kept = await (
        hook.keeps.submit(item) if hook.keeps is not None else ctx.redis.keep_send_decision(*item)
    )
    return _decode(kept)
