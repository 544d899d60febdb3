"""``send.settle``: what each typed answer of the send script becomes (an ack and a
fan-out, a duplicate's ack, a refusal, or "more work first"), and which failures of the
slow path are a store being down rather than a bug. No store is reached: the context's
clients connect lazily and the events go to a recording sink. The tests run in the
event loop, as the gateway calls ``settle``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from sqlalchemy.exc import IntegrityError, OperationalError

from im_server.app import build_context
from im_server.config import Settings
from im_server.context import Context
from im_server.errors import ImError
from im_server.protocol.ids import parse_conv_id
from im_server.services import send, send_stores
from im_server.storage.redis.replies import (
    CHECK_DEDUPE,
    NEEDS_SEQ_BLOCK,
    REDIS_RESET,
    ScriptReplyError,
    SendDuplicate,
    SendNeedsPermissions,
    SendOk,
    SendRefused,
    SendResult,
)

CONV = parse_conv_id("s:11:12")


class RecordingSink:
    def __init__(self) -> None:
        self.pushed: list[tuple[list[int] | tuple[int, ...], str, int | None]] = []
        self.invalidated: list[tuple[str, str]] = []

    def push(
        self, user_ids: list[int] | tuple[int, ...], text: str, exclude_conn: int | None = None
    ) -> None:
        self.pushed.append((user_ids, text, exclude_conn))

    def invalidate(self, kind: str, key: str) -> None:
        self.invalidated.append((kind, key))


@pytest.fixture
async def ctx() -> AsyncIterator[Context]:
    settings = Settings(
        database_url="postgresql://im@127.0.0.1:9/im", redis_url="redis://127.0.0.1:9/0"
    )
    c = build_context(settings)
    c.events = RecordingSink()
    yield c
    for t in list(c.background):  # background refills would only find no store
        t.cancel()
    await asyncio.gather(*c.background, return_exceptions=True)
    await c.redis.close()
    await c.db.dispose()


def _sink(ctx: Context) -> RecordingSink:
    assert isinstance(ctx.events, RecordingSink)
    return ctx.events


def _args(ctx: Context) -> send.SendArgs:
    return send.new_args(ctx, 11, CONV, "cm-1", "text", '{"text":"hi"}')


async def test_ok_acks_and_fans_out(ctx: Context) -> None:
    args = _args(ctx)
    out = send.settle(ctx, CONV, args, SendOk(5, 1700000000000, False), 77, 0.0)
    assert out is not None
    assert (out["seq"], out["server_time"], out["duplicate"]) == (5, 1700000000000, False)
    assert (out["conv_id"], out["client_msg_id"]) == ("s:11:12", "cm-1")
    ((users, text, exclude),) = _sink(ctx).pushed
    assert tuple(users) == (11, 12) and exclude == 77
    frame = orjson.loads(text)
    assert frame["type"] == "message" and frame["message"]["seq"] == 5
    assert frame["message"]["content"] == {"text": "hi"}
    assert not ctx.seq_refills.topping_up


async def test_ok_with_a_short_block_tops_it_up(ctx: Context) -> None:
    out = send.settle(ctx, CONV, _args(ctx), SendOk(6, 1, True), None, 0.0)
    assert out is not None and out["seq"] == 6
    assert ctx.seq_refills.topping_up == {"s:11:12"}
    assert len(ctx.background) == 1


async def test_a_duplicate_acks_the_original_without_a_push(ctx: Context) -> None:
    out = send.settle(ctx, CONV, _args(ctx), SendDuplicate("s:11:12", 3, 99), None, 0.0)
    assert out is not None
    assert (out["seq"], out["server_time"], out["duplicate"]) == (3, 99, True)
    assert _sink(ctx).pushed == []


@pytest.mark.parametrize("code", ["not_friends", "blocked", "not_member"])
async def test_a_refusal_raises_its_code(ctx: Context, code: str) -> None:
    with pytest.raises(ImError) as e:
        send.settle(ctx, CONV, _args(ctx), SendRefused(code), None, 0.0)  # type: ignore[arg-type]
    assert e.value.code == code and e.value.status == 403
    assert e.value.message != code  # a sentence, not the bare code
    assert _sink(ctx).pushed == []


@pytest.mark.parametrize(
    "answer", [SendNeedsPermissions("4"), NEEDS_SEQ_BLOCK, REDIS_RESET, CHECK_DEDUPE]
)
async def test_answers_that_need_work_first_settle_nothing(
    ctx: Context, answer: SendResult
) -> None:
    assert send.settle(ctx, CONV, _args(ctx), answer, None, 0.0) is None
    assert _sink(ctx).pushed == [] and not ctx.background


@pytest.mark.parametrize(
    ("error", "store"),
    [
        (RedisConnectionError("gone"), "redis"),
        (ResponseError("READONLY You can't write against a read only replica."), "redis"),
        (OperationalError("SELECT 1", {}, OSError("refused")), "postgres"),
        (ConnectionRefusedError(111, "refused"), "postgres"),
        (TimeoutError(), "postgres"),
        (asyncpg.ConnectionDoesNotExistError("closed"), "postgres"),
        (asyncpg.CannotConnectNowError("starting up"), "postgres"),
        (KeyError("bug"), None),
        (TypeError("bug"), None),
        (ScriptReplyError("send script: unexpected answer"), None),
        (IntegrityError("INSERT", {}, Exception("duplicate key")), None),
    ],
)
def test_which_failures_are_a_store_down(error: Exception, store: str | None) -> None:
    assert send_stores.failed_store(error) == store
