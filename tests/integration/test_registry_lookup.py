"""The registry lookup that routes a frame to other processes (``RedisStore.nodes_of``):
per user, the nodes listed for it now, the origin left out, lapsed entries and users on
no other node left out, in one call however many users a group's frame names."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from im_server.storage.redis import keys
from im_server.storage.redis.store import RedisStore
from tests.support import Stores


@pytest.fixture
async def store(stores: Stores) -> AsyncIterator[RedisStore]:
    r = RedisStore(stores.redis.url, dedupe_ttl=60)
    try:
        yield r
    finally:
        await r.close()


async def test_nodes_of_leaves_out_the_origin_and_lapsed_entries(store: RedisStore) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b, c = f"a-{tag}", f"b-{tag}", f"c-{tag}"
    base = 10**15 + int(uuid.uuid4().int % 10**9) * 10  # user ids nobody else uses
    u1, u2, u3, u4, u5 = (base + i for i in range(1, 6))
    await store.register_users(a, [u1, u2, u3], 60_000)
    await store.register_users(b, [u1, u3], 60_000)
    await store.register_users(c, [u3], 60_000)
    await store.client.zadd(keys.user_nodes(u4), {b: int(time.time() * 1000) - 1})  # lapsed
    got = await store.nodes_of([u1, u2, u3, u4, u5], a)
    assert {u: sorted(ns) for u, ns in got.items()} == {u1: [b], u3: [b, c]}
    assert await store.nodes_of([], a) == {}


async def test_nodes_of_a_big_group_in_one_call(store: RedisStore) -> None:
    tag = uuid.uuid4().hex[:8]
    base = 2 * 10**15 + int(uuid.uuid4().int % 10**9) * 10_000
    users = [base + i for i in range(5000)]
    await store.register_users(f"far-{tag}", users[::2], 60_000)
    await store.register_users(f"here-{tag}", users, 60_000)
    got = await store.nodes_of(users, f"here-{tag}")
    assert got == {u: [f"far-{tag}"] for u in users[::2]}
