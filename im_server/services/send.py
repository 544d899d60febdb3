"""The send pipeline: validate, then ONE Redis script call that dedupes, checks the
sender's rights, allocates the seq and queues the message on the durable stream; then
the ack, then the fan-out (off the sender's path). The persister writes PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from pydantic import JsonValue
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from im_server import metrics
from im_server.context import Context, DedupeChecker
from im_server.context.batching import Coalescer
from im_server.errors import ImError, bad_request, is_store_error, unavailable
from im_server.protocol.attachments import ATTACHMENT_TYPES
from im_server.protocol.client_frames import SendFields
from im_server.protocol.ids import ConvRef
from im_server.protocol.server_frames import AckOk, ack, message_frame
from im_server.protocol.session import SendCmd
from im_server.services import members, permissions, recovery, seqs, uploads
from im_server.services.history import window
from im_server.storage import conversations
from im_server.storage import messages as msg_store
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
    ctx.rate.send.check(sender_id, "messages")
    return encoded.decode()


def _has_nul(value: JsonValue) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


@dataclass(slots=True)
class Extras:
    """What a send mentions and answers, once checked by :func:`check_extras`."""

    mentions: list[int]
    mention_all: bool
    reply_to: int | None
    # a picture or file: the content the server wrote from the upload (None: as sent)
    content_json: str | None = None


async def check_extras(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    mentions: list[int],
    mention_all: bool,
    reply_to: int | None,
) -> Extras:
    """The checks of a send that mentions or replies (a plain send never comes here, so
    its path keeps its one Redis call). Mentions are for groups: in a single chat they
    are refused (``bad_request``); ids that are not active members now are dropped
    (from the members cache), the rest kept once each, ascending. ``mention_all`` needs
    the owner or an admin (``forbidden``). ``reply_to`` must be in the sender's window:
    not below its start (a clear, a join without history) and not above its end (a
    kick) nor above the conversation's allocated end (``bad_request``)."""
    if ref.kind == "single" and (mentions or mention_all):
        raise bad_request("mentions and mention_all are for group messages only")
    if not mentions and not mention_all and reply_to is None:
        return Extras([], False, None)
    async with ctx.db.connect() as conn:
        conv, me = await conversations.conv_and_member(conn, ref.conv_id, sender_id)
    if ref.kind == "group" and (me is None or not me.active):
        raise ImError("not_member", permissions.DENIED["not_member"])
    if mention_all and (me is None or me.role < conversations.ROLE_ADMIN):
        raise ImError("forbidden", "only the group's owner and admins can mention all")
    if reply_to is not None:
        if conv is None or me is None:
            raise bad_request(_BAD_REPLY)
        win = window(conv, me)
        if reply_to < win.lo or (me.max_seq is not None and reply_to > me.max_seq):
            raise bad_request(_BAD_REPLY)
        if reply_to > conv.max_seq and reply_to > await seqs.current_end(ctx, ref.conv_id):
            raise bad_request(_BAD_REPLY)
    kept: list[int] = []
    if mentions:
        current = set(await members.recipients(ctx, ref))
        kept = sorted({u for u in mentions if u in current})
    return Extras(kept, mention_all, reply_to)


async def earlier_ack(ctx: Context, conv_id: str, sender_id: int, cmid: str) -> AckOk | None:
    """The first ack of a send repeated after its checks stopped passing (the sender was
    kicked, its reply target cleared): a repeat answers what the first send got, never a
    refusal of a message that exists. Asked only once a check refused, so a plain or
    accepted send pays nothing. Redis first; PostgreSQL when Redis forgot the key."""
    found = await ctx.redis.get_dedupe(conv_id, sender_id, cmid)
    if found is None:
        found = await ctx.dedupe_checker.submit((sender_id, cmid))
    if found is None:
        return None
    _DUP.inc()
    return ack(found.conv_id, cmid, found.seq, found.server_time, True)


async def checked_extras(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    fields: SendFields | SendCmd,
) -> Extras | AckOk:
    """:func:`check_extras` and, for a picture or file, the upload's check
    (``services.uploads.check_attachment``), or the first ack when a refused send is a
    repeat."""
    cmid = fields.client_msg_id
    try:
        extras = await check_extras(
            ctx, sender_id, ref, fields.mentions, fields.mention_all, fields.reply_to
        )
        if fields.content_type in ATTACHMENT_TYPES:
            extras.content_json = await uploads.check_attachment(
                ctx, sender_id, fields.content_type, fields.content
            )
        return extras
    except ImError:
        first = await earlier_ack(ctx, ref.conv_id, sender_id, cmid)
        if first is None or first["conv_id"] != ref.conv_id:
            raise
        return first


_BAD_REPLY = "reply_to must be the seq of a message you can see in this conversation"
_OK = metrics.SENDS.labels("ok")
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


def failed_store(e: BaseException) -> str | None:
    """Which store ``e`` says is unreachable or failing: 'redis', 'postgres', or None when
    it is neither (a bug, which must surface as one rather than as `unavailable`).
    Redis errors all come wrapped by redis-py; a bare OSError or timeout here comes from
    the PostgreSQL driver connecting."""
    if isinstance(e, RedisError):
        return "redis"
    if isinstance(e, _PG_FAILURES) or is_store_error(e):
        return "postgres"
    return None


_PG_FAILURES = (
    OperationalError,
    InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,  # shutting down, starting up, statement timeout
)


def dedupe_checker(engine: AsyncEngine) -> DedupeChecker:
    """Looks (sender, client_msg_id) pairs up in PostgreSQL, many per query: used only
    while a Redis that lost its data may have forgotten recent sends."""

    async def run(pairs: list[tuple[int, str]]) -> list[SendDuplicate | None]:
        async with engine.connect() as conn:
            found = await msg_store.by_dedupe_keys(conn, pairs)
        out: list[SendDuplicate | None] = []
        for p in pairs:
            hit = found.get(p)
            out.append(SendDuplicate(*hit) if hit is not None else None)
        return out

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
    args: SendArgs | None = None,
) -> None:
    """Push the message to every device of every member but ``exclude_conn``; at once
    when the members are cached, else after loading them (off the sender's path)."""
    if args is None:
        frame = message_frame(ref.conv_id, seq, sender_id, cmid, ctype, content_json, ts)
    else:
        frame = message_frame(
            ref.conv_id,
            seq,
            sender_id,
            cmid,
            ctype,
            content_json,
            ts,
            mentions=args.mentions,
            mention_all=args.mention_all,
            reply_to=args.reply_to,
        )
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
