"""The send script (``send_batch.lua``) driven by hand against a real Valkey: what it
reads once per call (permissions, seq counters) stays exact within the call, the
dedupe check and claim are one command, and a call that stops half way keeps the
counter of what it queued (DESIGN.md invariants 2 and 3)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from im_server.runtime.embedded import start_redis
from im_server.runtime.redis_server import EmbeddedRedis
from im_server.storage.redis import keys
from im_server.storage.redis.replies import (
    SendDuplicate,
    SendNeedsPermissions,
    SendNeedsSeqBlock,
    SendOk,
    SendRefused,
    SendResult,
)
from im_server.storage.redis.store import RedisStore, SendArgs

TS = 1_800_000_000_000


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    rd = start_redis(tmp_path_factory.mktemp("send-script") / "redis")
    yield rd
    rd.stop()


@pytest.fixture
async def store(valkey: EmbeddedRedis) -> AsyncIterator[RedisStore]:
    s = RedisStore(valkey.url, dedupe_ttl=60)
    await s.client.flushall()
    await s.boot_markers(write=True)
    yield s
    await s.close()


def send(conv: str, sender: int, cmid: str) -> SendArgs:
    return SendArgs(conv, sender, cmid, "text", '{"text":"hi"}', TS, partition=0)


async def ready(
    store: RedisStore, conv: str, members: dict[int, str], seqs: int = 1_000_000
) -> None:
    """A conversation whose caches are warm: permissions loaded, a block of seqs."""
    assert await store.load_perm(conv, await store.perm_epoch(conv), members, 600)
    await store.extend_seq(conv, 0, seqs)


async def stream_seqs(store: RedisStore) -> list[int]:
    entries = await store.client.xrange(keys.stream(0))
    return [int(f["q"]) for _, f in entries]


async def test_many_sends_to_one_conversation_take_consecutive_seqs(store: RedisStore) -> None:
    await ready(store, "s:1:2", {1: "ok", 2: "ok"})
    res = await store.send_many([send("s:1:2", 1 + i % 2, f"m{i}") for i in range(6)])
    assert [r.seq for r in res if isinstance(r, SendOk)] == [1, 2, 3, 4, 5, 6]
    assert await store.current_seq("s:1:2") == 6  # the counter written once, at the end
    assert await stream_seqs(store) == [1, 2, 3, 4, 5, 6]
    again = await store.send_many([send("s:1:2", 2, "m6")])
    assert again == [SendOk(7, TS, False)]


async def test_a_repeat_within_one_call_is_a_duplicate(store: RedisStore) -> None:
    await ready(store, "s:1:2", {1: "ok", 2: "ok"})
    res = await store.send_many([send("s:1:2", 1, "x"), send("s:1:2", 1, "x")])
    assert res == [SendOk(1, TS, False), SendDuplicate("s:1:2", 1, TS)]
    assert await stream_seqs(store) == [1]
    assert await store.get_dedupe("s:1:2", 1, "x") == SendDuplicate("s:1:2", 1, TS)


async def test_a_block_that_runs_out_within_a_call(store: RedisStore) -> None:
    await ready(store, "s:1:2", {1: "ok", 2: "ok"}, seqs=3)
    res = await store.send_many([send("s:1:2", 1, f"b{i}") for i in range(5)])
    assert [type(r) for r in res] == [SendOk] * 3 + [SendNeedsSeqBlock] * 2
    assert await store.current_seq("s:1:2") == 3
    # the sends that waited claimed nothing: their retry is not a duplicate
    assert await store.get_dedupe("s:1:2", 1, "b3") is None
    await store.extend_seq("s:1:2", 3, 10)
    assert await store.send_many([send("s:1:2", 1, "b3")]) == [SendOk(4, TS, True)]  # short


async def test_permissions_per_sender_within_one_call(store: RedisStore) -> None:
    await ready(store, "g:7", {1: "ok", 2: f"muted:{TS + 1}"})
    res = await store.send_many(
        [send("g:7", 1, "a"), send("g:7", 3, "b"), send("g:7", 2, "c"), send("g:7", 1, "d")]
    )
    expected: list[SendResult] = [
        SendOk(1, TS, False),
        SendRefused("not_member"),
        SendRefused("muted"),
        SendOk(2, TS, False),
    ]
    assert res == expected
    cold = await store.send_many([send("g:8", 1, "e")])
    assert cold == [SendNeedsPermissions("0")]


async def test_a_refused_repeat_still_gets_its_first_answer(store: RedisStore) -> None:
    """Kicked after the send, a retry of it (its ack was lost) is a duplicate with the
    first seq, not a refusal; a new send is refused."""
    await ready(store, "g:9", {1: "ok", 2: "ok"})
    assert await store.send_many([send("g:9", 2, "first")]) == [SendOk(1, TS, False)]
    await store.invalidate_perm(["g:9"])
    assert await store.load_perm("g:9", await store.perm_epoch("g:9"), {1: "ok"}, 600)
    res = await store.send_many([send("g:9", 2, "first"), send("g:9", 2, "second")])
    assert res == [SendDuplicate("g:9", 1, TS), SendRefused("not_member")]
    await store.invalidate_perm(["g:9"])  # cold: the repeat is still found
    res = await store.send_many([send("g:9", 2, "first")])
    assert res == [SendDuplicate("g:9", 1, TS)]


async def test_a_queue_write_that_fails_frees_its_key_and_keeps_the_counter(
    store: RedisStore, valkey: EmbeddedRedis
) -> None:
    """The stream refuses the entry (here: the key holds a string): the call answers the
    error, the send's dedupe key is freed and the counter is that of what was queued, so
    the retry takes the same seq and no seq is handed out twice."""
    await ready(store, "s:1:2", {1: "ok", 2: "ok"})
    assert await store.send_many([send("s:1:2", 1, "q0")]) == [SendOk(1, TS, False)]
    raw = aioredis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        entries = await raw.xrange(keys.stream(0))
        await raw.delete(keys.stream(0))
        await raw.set(keys.stream(0), "not a stream")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await store.send_many([send("s:1:2", 1, "q1"), send("s:1:2", 2, "q2")])
        assert await store.get_dedupe("s:1:2", 1, "q1") is None
        assert await store.current_seq("s:1:2") == 1
        await raw.delete(keys.stream(0))
        for _, f in entries:
            await raw.xadd(keys.stream(0), f)
    finally:
        await raw.aclose()
    res = await store.send_many([send("s:1:2", 1, "q1"), send("s:1:2", 2, "q2")])
    assert res == [SendOk(2, TS, False), SendOk(3, TS, False)]
    assert await stream_seqs(store) == [1, 2, 3]
