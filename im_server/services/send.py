"""The send pipeline: validate, then ONE Redis script call that dedupes, checks the
sender's rights, allocates the seq and queues the message on the durable stream; then
the ack, then the fan-out (off the sender's path). The persister writes PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import orjson
from pydantic import JsonValue
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, bad_request, unavailable
from im_server.ids import ConvRef
from im_server.protocol.server_frames import AckOk, ack, message_frame
from im_server.services import members, permissions, recovery, seqs
from im_server.services.coalesce import Coalescer
from im_server.storage import messages as msg_store
from im_server.storage.redis import keys
from im_server.storage.redis.store import SendArgs

log = logging.getLogger("im_server.send")
_MAX_ATTEMPTS = 60


def check_send(ctx: Context, sender_id: int, ref: ConvRef, content: dict[str, JsonValue]) -> str:
    """The checks of a send (frame or REST body) that need the server, once the protocol
    models have checked the fields: the content's size and storability, the sender's
    place in a single chat, the rate limit. Returns the content as compact JSON."""
    try:
        encoded = orjson.dumps(content)
    except (TypeError, orjson.JSONEncodeError) as e:
        raise bad_request(f"content cannot be encoded: {e}") from e
    if b"\\u0000" in encoded and _has_nul(content):  # jsonb cannot hold a NUL character
        raise bad_request("content must not contain NUL characters")
    if len(encoded) > ctx.settings.max_content_bytes:
        raise ImError(
            "too_large",
            f"content is {len(encoded)} bytes, the limit is {ctx.settings.max_content_bytes}",
        )
    if ref.kind == "single" and not ref.has_user(sender_id):
        raise ImError("not_member", "this single chat is not yours")
    ctx.extra["rate_send"].check(sender_id, "messages")
    return encoded.decode()


def _has_nul(value: JsonValue) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


_OK = metrics.SENDS.labels("ok")
_DUP = metrics.SENDS.labels("duplicate")


def new_args(
    ctx: Context, sender_id: int, ref: ConvRef, cmid: str, ctype: str, content_json: str
) -> SendArgs:
    return SendArgs(
        conv_id=ref.conv_id,
        sender_id=sender_id,
        client_msg_id=cmid,
        content_type=ctype,
        content_json=content_json,
        server_time=int(time.time() * 1000),
        partition=keys.partition_of(ref.conv_id, ctx.settings.stream_partitions),
    )


def submit(ctx: Context, args: SendArgs) -> asyncio.Future[Any]:
    """Queue the script call; sends arriving together share one round trip."""
    return ctx.send_batcher.submit(args)  # type: ignore[no-any-return]


def settle(
    ctx: Context,
    ref: ConvRef,
    args: SendArgs,
    r: list[Any],
    exclude_conn: int | None,
    started: float,
) -> AckOk | None:
    """The ack for a final script answer (and the fan-out of a new message); raises the
    refusal; None when the answer asks for work first (the slow path in ``do_send``)."""
    status = r[0]
    if status == "ok":
        seq, ts = int(r[1]), int(r[2])
        if int(r[3]):
            seqs.refill_soon(ctx, ref)
        _OK.inc()
        metrics.SEND_LATENCY.observe(time.perf_counter() - started)
        fan_out(
            ctx,
            ref,
            seq,
            args.sender_id,
            args.client_msg_id,
            args.content_type,
            args.content_json,
            ts,
            exclude_conn,
        )
        return ack(ref.conv_id, args.client_msg_id, seq, ts, False)
    if status == "dup":
        conv_id, seq_s, ts_s = str(r[1]).split("|")
        _DUP.inc()
        return ack(conv_id, args.client_msg_id, int(seq_s), int(ts_s), True)
    if status == "denied":
        metrics.SENDS.labels(str(r[1])).inc()
        raise ImError(str(r[1]), _DENIED.get(str(r[1]), str(r[1])))
    return None


async def _run_script(ctx: Context, args: SendArgs) -> list[Any]:
    """One call of the send script. A connection error is retried once: a pooled
    connection may have died with a restarted Redis, and a repeat is safe because the
    script dedupes (sender, client_msg_id)."""
    try:
        try:
            res = await submit(ctx, args)
        except (RedisConnectionError, ConnectionError):
            res = await submit(ctx, args)
    except (TimeoutError, RedisError, OSError) as e:
        metrics.STORE_ERRORS.labels("redis").inc()
        raise unavailable("the message queue is unavailable, try again") from e
    return res  # type: ignore[no-any-return]


async def do_send(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    cmid: str,
    ctype: str,
    content_json: str,
    *,
    exclude_conn: int | None = None,
    skip_perm: bool = False,
) -> AckOk:
    """Queue one message and fan it out; returns the ack body. Raises ImError on refusal.
    Handles every answer of the script, the slow ones too (permissions to load, a seq
    block to reserve, a Redis that lost its data, a dedupe to ask PostgreSQL about)."""
    started = time.perf_counter()
    args = new_args(ctx, sender_id, ref, cmid, ctype, content_json)
    args.skip_perm = skip_perm
    for _ in range(_MAX_ATTEMPTS):
        r = await _run_script(ctx, args)
        out = settle(ctx, ref, args, r, exclude_conn, started)
        if out is not None:
            return out
        status = r[0]
        try:
            if status == "perm_cold":
                if not await permissions.load_send_permissions(ctx, ref, str(r[1])):
                    args.skip_perm = True
            elif status == "need_block":
                await seqs.refill(ctx, ref)
            elif status == "reset":
                await recovery.check_redis_epoch(ctx)
            elif status == "check_pg":
                found = await ctx.extra["dedupe_checker"].submit((sender_id, cmid))
                if found is not None:
                    conv_id, seq, ts = found
                    await ctx.redis.set_dedupe(sender_id, cmid, f"{conv_id}|{seq}|{ts}")
                    _DUP.inc()
                    return ack(conv_id, cmid, seq, ts, True)
                args.skip_cold = True
            else:
                raise RuntimeError(f"unexpected send script answer {r!r}")
        except ImError:
            raise
        except (TimeoutError, RedisError, OSError) as e:
            metrics.STORE_ERRORS.labels("redis").inc()
            raise unavailable("the message queue is unavailable, try again") from e
        except Exception as e:  # PostgreSQL down while refilling seqs or rechecking dedupe
            metrics.STORE_ERRORS.labels("postgres").inc()
            log.warning("send to %s could not complete (%s): %r", ref.conv_id, status, e)
            raise unavailable("the database is unavailable, try again") from e
    raise unavailable("the send could not be completed, try again")


_DENIED = {
    "not_friends": "you are not friends (or one side removed the other)",
    "blocked": "the receiver blocked you",
    "not_member": "you are not a member of this conversation",
}


def dedupe_checker(ctx: Context) -> Coalescer[tuple[int, str], tuple[str, int, int] | None]:
    """Looks (sender, client_msg_id) pairs up in PostgreSQL, many per query: used only
    while a Redis that lost its data may have forgotten recent sends."""

    async def run(pairs: list[tuple[int, str]]) -> list[tuple[str, int, int] | None]:
        async with ctx.db.connect() as conn:
            found = await msg_store.by_dedupe_keys(conn, pairs)
        return [found.get(p) for p in pairs]

    return Coalescer(run, 500)


def fan_out(
    ctx: Context,
    ref: ConvRef,
    seq: int,
    sender_id: int,
    cmid: str,
    ctype: str,
    content_json: str,
    ts: int,
    exclude_conn: int | None,
) -> None:
    """Push the message to every device of every member but ``exclude_conn``; at once
    when the members are cached, else after loading them (off the sender's path)."""
    frame = message_frame(ref.conv_id, seq, sender_id, cmid, ctype, content_json, ts)
    users = members.cached_recipients(ctx, ref)
    if users is not None:
        ctx.events.push(users, frame, exclude_conn)
        return

    async def _later() -> None:
        try:
            ctx.events.push(await members.recipients(ctx, ref), frame, exclude_conn)
        except Exception as e:  # noqa: BLE001 - the message is queued; devices catch up by sync
            log.warning("fan-out of %s/%d skipped, members unknown: %r", ref.conv_id, seq, e)

    ctx.spawn(_later())


async def send_system(
    ctx: Context, actor_id: int, ref: ConvRef, ctype: str, content: dict[str, Any]
) -> AckOk:
    """A server-made message (membership change, recall notice) through the same pipeline."""
    return await do_send(
        ctx,
        actor_id,
        ref,
        f"{ctype}-{uuid.uuid4().hex}",
        ctype,
        orjson.dumps(content).decode(),
        skip_perm=True,
    )
