"""The send use case, owned here from the frame (or REST body) to the ack: check
(``send_checks.py``), then ONE Redis script call that dedupes, checks the sender's
rights, allocates the seq and queues the message on the durable stream; then the ack,
then the fan-out (off the sender's path). The persister writes PostgreSQL.

Every edge makes the same call, :func:`accept`: the WebSocket gateway (which frames the
answer, keeps the order of one socket's acks and writes) and REST. A plain send, the
common one, takes the fast path: its script call is batched with the others of the
moment and it is answered from that call's callback, without a task. Anything that
needs work first (a mention, a reply, an upload, rights to load, a seq block, a lost
Redis) runs as one task. Notices made by the server (edits, reactions, membership
changes, recalls) go through :func:`do_send`, the same pipeline without the checks of a
client's send."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, is_store_error, unavailable
from im_server.protocol.client_frames import SendFields
from im_server.protocol.ids import ConvRef
from im_server.protocol.server_frames import AckOk, ack
from im_server.protocol.session import SendCmd
from im_server.services import before_send, permissions, recovery, send_checks, seqs
from im_server.services.fan_out import fan_out
from im_server.services.send_checks import Extras
from im_server.services.send_stores import failed_store
from im_server.storage.redis.replies import (
    SendCheckDedupe,
    SendDuplicate,
    SendNeedsPermissions,
    SendNeedsSeqBlock,
    SendOk,
    SendRedisReset,
    SendRefused,
    SendResult,
)
from im_server.storage.redis.store import SendArgs

log = logging.getLogger("im_server.send")
_MAX_ATTEMPTS = 60


_OK = metrics.SENDS.labels("ok")
_SEND_FAILED = "the send failed, try again (a repeat with the same client_msg_id is safe)"


def accept(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    fields: SendFields | SendCmd,
    *,
    exclude_conn: int | None = None,
) -> asyncio.Future[AckOk]:
    """THE send: a future of its ack (``ok: true``; a repeat's carries ``duplicate``), or
    of the refusal (an :class:`ImError`: ``not_friends``, ``muted``, ``rate_limited``,
    ``unavailable``...). ``exclude_conn``: the sender's socket, which gets the ack and
    not the message. A store fault or a bug on the way is answered ``unavailable``
    (retry-safe: the pipeline dedupes), the bug logged with its traceback."""
    out: asyncio.Future[AckOk] = asyncio.get_running_loop().create_future()
    try:
        content_json = send_checks.check_send(ctx, sender_id, ref, fields.content)
    except ImError as e:
        metrics.SENDS.labels(e.code).inc()
        out.set_exception(e)
        return out
    if ctx.before_send.configured:  # the app's rules first: no seq before its answer
        _into(ctx, out, _hooked_send(ctx, sender_id, ref, fields, content_json, exclude_conn))
        return out
    if not fields.plain or ctx.rate.send.needs_round_trip(sender_id):
        _into(ctx, out, _checked_send(ctx, sender_id, ref, fields, content_json, exclude_conn))
        return out
    ctx.rate.send.spend_leased(sender_id)  # with other processes: a token in hand
    args = new_args(ctx, sender_id, ref, fields.client_msg_id, fields.content_type, content_json)
    started = time.perf_counter()

    def answered(fut: asyncio.Future[SendResult]) -> None:
        try:
            if not fut.cancelled() and fut.exception() is None:
                ack_ = settle(ctx, ref, args, fut.result(), exclude_conn, started)
                if ack_ is not None:
                    out.set_result(ack_)
                    return
        except ImError as e:
            out.set_exception(e)
            return
        except Exception:  # a bug in settle: logged and counted; the slow path answers
            log.exception("send fast path failed")
            metrics.SENDS.labels("internal").inc()
        # a store fault, or an answer that needs work first
        _into(
            ctx,
            out,
            do_send(
                ctx,
                sender_id,
                ref,
                args.client_msg_id,
                args.content_type,
                args.content_json,
                exclude_conn=exclude_conn,
            ),
        )

    submit(ctx, args).add_done_callback(answered)
    return out


async def _hooked_send(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    fields: SendFields | SendCmd,
    content_json: str,
    exclude_conn: int | None,
) -> AckOk:
    """A send shown to the before-send hook first (``services/before_send.py``): rejected
    (no seq used), sent with the hook's content, or sent as it is."""
    d = await before_send.decide(ctx, sender_id, ref, fields)
    if d.action == "reject":
        metrics.SENDS.labels("rejected").inc()
        raise ImError("rejected", d.reason)
    if d.action == "unavailable":
        metrics.SENDS.labels("unavailable").inc()
        raise unavailable(d.reason)
    if d.action == "replace" and d.content is not None:
        content_json = send_checks.encode_content(ctx, d.content)
        fields = (
            fields.model_copy(update={"content": d.content})
            if isinstance(fields, SendFields)
            else dataclasses.replace(fields, content=d.content)
        )
    return await _checked_send(ctx, sender_id, ref, fields, content_json, exclude_conn)


async def _checked_send(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    fields: SendFields | SendCmd,
    content_json: str,
    exclude_conn: int | None,
) -> AckOk:
    """A send that mentions, replies or carries an upload: its checks read the members,
    the window or the upload first. With other processes serving, any send whose
    sender holds no shared token here: a lease of them is taken first
    (``context/limits.py``)."""
    await ctx.rate.send.check_shared(sender_id, "messages")
    if fields.plain:
        return await do_send(
            ctx,
            sender_id,
            ref,
            fields.client_msg_id,
            fields.content_type,
            content_json,
            exclude_conn=exclude_conn,
        )
    extras = await send_checks.checked_extras(ctx, sender_id, ref, fields)
    if not isinstance(extras, send_checks.Extras):
        return extras  # a repeat of an accepted send: its first ack
    return await do_send(
        ctx,
        sender_id,
        ref,
        fields.client_msg_id,
        fields.content_type,
        extras.content_json or content_json,
        exclude_conn=exclude_conn,
        extras=extras,
    )


def _into(ctx: Context, out: asyncio.Future[AckOk], work: Coroutine[Any, Any, AckOk]) -> None:
    """Run ``work`` as a task and settle ``out`` with its answer; a failure that is not
    a refusal becomes ``unavailable``."""

    async def run() -> None:
        try:
            out.set_result(await work)
        except ImError as e:
            if e.code not in ("unavailable", *permissions.DENIED):
                metrics.SENDS.labels(e.code).inc()
            out.set_exception(e)
        except Exception as e:  # the use case's boundary: the sender must get an answer
            if is_store_error(e):
                log.warning("a send failed, a store is unavailable: %r", e)
            else:
                log.exception("a send failed")
            out.set_exception(unavailable(_SEND_FAILED))

    ctx.spawn(run(), name="send")


_DUP = metrics.SENDS.labels("duplicate")


def new_args(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    cmid: str,
    ctype: str,
    content_json: str,
    extras: Extras | None = None,
) -> SendArgs:
    args = SendArgs(
        conv_id=ref.conv_id,
        sender_id=sender_id,
        client_msg_id=cmid,
        content_type=ctype,
        content_json=content_json,
        server_time=int(time.time() * 1000),
        partition=ctx.redis.part(ref.conv_id),
    )
    if extras is not None:
        args.mentions = extras.mentions
        args.mention_all = extras.mention_all
        args.reply_to = extras.reply_to
    return args


def submit(ctx: Context, args: SendArgs) -> asyncio.Future[SendResult]:
    """Queue the script call; sends arriving together share one round trip."""
    return ctx.send_batcher.submit(args)


def settle(
    ctx: Context,
    ref: ConvRef,
    args: SendArgs,
    r: SendResult,
    exclude_conn: int | None,
    started: float,
) -> AckOk | None:
    """The ack for a final script answer (and the fan-out of a new message); raises the
    refusal; None when the answer asks for work first (the slow path in ``do_send``)."""
    if isinstance(r, SendOk):
        if r.refill:
            seqs.refill_soon(ctx, ref)
        _OK.inc()
        metrics.SEND_LATENCY.observe(time.perf_counter() - started)
        fan_out(
            ctx,
            ref,
            r.seq,
            args.sender_id,
            args.client_msg_id,
            args.content_type,
            args.content_json,
            r.server_time,
            exclude_conn,
            args,
        )
        return ack(ref.conv_id, args.client_msg_id, r.seq, r.server_time, False)
    if isinstance(r, SendDuplicate):
        _DUP.inc()
        return ack(r.conv_id, args.client_msg_id, r.seq, r.server_time, True)
    if isinstance(r, SendRefused):
        metrics.SENDS.labels(r.code).inc()
        raise ImError(r.code, permissions.DENIED[r.code])
    return None


async def _run_script(ctx: Context, args: SendArgs) -> SendResult:
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
    return res


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
    extras: Extras | None = None,
) -> AckOk:
    """Queue one message and fan it out; returns the ack body. Raises ImError on refusal.
    Handles every answer of the script, the slow ones too (permissions to load, a seq
    block to reserve, a Redis that lost its data, a dedupe to ask PostgreSQL about)."""
    started = time.perf_counter()
    args = new_args(ctx, sender_id, ref, cmid, ctype, content_json, extras)
    args.skip_perm = skip_perm
    try:
        for _ in range(_MAX_ATTEMPTS):
            r = await _run_script(ctx, args)
            out = settle(ctx, ref, args, r, exclude_conn, started)
            if out is not None:
                return out
            found = await _prepare_retry(ctx, ref, args, r)
            if found is not None:
                _DUP.inc()
                return ack(found.conv_id, cmid, found.seq, found.server_time, True)
    except ImError:
        raise
    except Exception:
        metrics.SENDS.labels("internal").inc()  # a bug: the caller logs it with its traceback
        raise
    raise unavailable("the send could not be completed, try again")


async def _prepare_retry(
    ctx: Context, ref: ConvRef, args: SendArgs, r: SendResult
) -> SendDuplicate | None:
    """Do the work a script answer asks for before the next attempt; returns the
    original when PostgreSQL already holds this send. A store failure on the way is
    ``unavailable``; anything else is a bug and propagates as it is."""
    try:
        match r:
            case SendNeedsPermissions(epoch=epoch):
                if not await permissions.load_send_permissions(ctx, ref, epoch):
                    args.skip_perm = True
            case SendNeedsSeqBlock():
                await seqs.refill(ctx, ref)
            case SendRedisReset():
                await recovery.check_redis_epoch(ctx)
            case SendCheckDedupe():
                key = (args.sender_id, args.client_msg_id)
                found = await ctx.dedupe_checker.submit(key)
                if found is not None:
                    await ctx.redis.set_dedupe(
                        args.conv_id, *key, found.conv_id, found.seq, found.server_time
                    )
                    return found
                args.skip_cold = True
            case _:
                raise RuntimeError(f"settle left the final answer {r!r} unanswered")
    except ImError:
        raise
    except Exception as e:  # a store failure: `unavailable`; a bug: raised
        store = failed_store(e)
        if store is None:
            raise
        metrics.STORE_ERRORS.labels(store).inc()
        if store == "redis":
            raise unavailable("the message queue is unavailable, try again") from e
        log.warning("send to %s could not complete (%r): %r", ref.conv_id, r, e)
        raise unavailable("the database is unavailable, try again") from e
    return None


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
