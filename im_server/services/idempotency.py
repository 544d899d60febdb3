"""Writes of the app's servers under an ``Idempotency-Key``: the same key (per API key)
with the same request within ``IM_IDEMPOTENCY_HOURS`` gets the first answer again and
changes nothing; with another request it is a ``conflict``.

The key is claimed in PostgreSQL before the write runs and the answer recorded after
it, so two calls at once with one key run the write once (the second is told the first
is in progress: ``conflict``, retry later). A refusal is recorded like a success (the
same call would be refused the same way), except ``unavailable`` and ``rate_limited``:
they release the key, so a retry runs the write. A process that dies between the write
and the record leaves a claim without an answer; after a minute a retry takes it over
and runs the write again, which the writes that matter most absorb by themselves (a
message's ``client_msg_id``, a member already in, a friendship already made)."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from im_server.context import Context
from im_server.errors import ImError, bad_request
from im_server.storage import idempotency as store
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.idempotency")

KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # visible ASCII
STALE_MS = 60_000
RETRYABLE = frozenset({"unavailable", "rate_limited"})


@dataclass(slots=True, frozen=True)
class Answer:
    status: int
    body: bytes  # JSON; empty for 204
    replayed: bool = False


def fingerprint(method: str, path: str, body: bytes) -> bytes:
    return hashlib.sha256(b"\0".join((method.encode(), path.encode(), body))).digest()


def check_key(value: str) -> str:
    if not KEY.fullmatch(value):
        raise bad_request("Idempotency-Key: 1-255 visible ASCII characters")
    return value


async def once(
    ctx: Context,
    key_id: int,
    idem_key: str | None,
    request_hash: bytes,
    work: Callable[[], Awaitable[Answer]],
) -> Answer:
    if idem_key is None:
        return await work()
    idem_key = check_key(idem_key)
    now = now_ms()
    expired = now - int(ctx.settings.idempotency_hours * 3_600_000)
    async with ctx.db.begin() as conn:
        rec = await store.claim(conn, key_id, idem_key, request_hash, now, now - STALE_MS, expired)
    if rec is not None:
        if rec.body_hash != request_hash:
            raise ImError("conflict", "this Idempotency-Key was used for another request")
        if rec.status is None or rec.answer is None:
            raise ImError("conflict", "a request with this Idempotency-Key is in progress")
        return Answer(rec.status, rec.answer, replayed=True)
    try:
        answer = await work()
    except ImError as e:
        if e.code in RETRYABLE:
            await _release(ctx, key_id, idem_key)
            raise
        await _record(ctx, key_id, idem_key, Answer(e.status, orjson.dumps(e.body())))
        raise
    except BaseException:
        await _release(ctx, key_id, idem_key)
        raise
    await _record(ctx, key_id, idem_key, answer)
    return answer


async def _record(ctx: Context, key_id: int, idem_key: str, answer: Answer) -> None:
    try:
        async with ctx.db.begin() as conn:
            await store.answer(conn, key_id, idem_key, answer.status, answer.body)
    except Exception as e:  # noqa: BLE001 - the write is done; a retry after a minute redoes it
        log.warning("the answer under an Idempotency-Key was not recorded: %r", e)


async def _release(ctx: Context, key_id: int, idem_key: str) -> None:
    try:
        async with ctx.db.begin() as conn:
            await store.release(conn, key_id, idem_key)
    except Exception as e:  # noqa: BLE001 - the claim goes stale in a minute
        log.warning("an Idempotency-Key claim was not released: %r", e)


async def prune(ctx: Context) -> int:
    """Forget the records past their time (a periodic job)."""
    before = now_ms() - int(ctx.settings.idempotency_hours * 3_600_000)
    async with ctx.db.begin() as conn:
        return await store.prune(conn, before)
