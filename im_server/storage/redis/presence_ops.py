"""Presence in Redis: each process lists itself with an expiry and records which of its
users and devices hold a connection; the scripts find who went online or offline
everywhere. A part of :class:`RedisStore`."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from im_server.storage.redis import keys
from im_server.storage.redis.replies import (
    join_devices,
    parse_live_devices,
    parse_offlines,
    parse_user_ids,
)


class PresenceOps:
    """Presence (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    _presence_set: AsyncScript
    _presence_sweep: AsyncScript

    # ---- presence ---------------------------------------------------------------------------

    async def presence_set(
        self,
        node: str,
        users: Sequence[tuple[int, Collection[str]]],
        grace_ms: int,
        last_seen_ttl_ms: int,
    ) -> list[int]:
        """Record (user, its devices with a connection here; none: it has none here) for
        this node (``presence_set.lua``); the users that went online everywhere and are to
        be announced."""
        if not users:
            return []
        args: list[str | int] = [*keys.PRESENCE_PIECES, node, _now_ms(), grace_ms]
        args.append(last_seen_ttl_ms)
        for user_id, devices in users:
            args.extend((user_id, join_devices(devices)))
        # the nodes zset is declared so that a Cluster client routes the call to the
        # slot of the {pr} tag, which every presence key carries
        res = await self._presence_set(keys=[keys.PRESENCE_NODES], args=args)
        return parse_user_ids(res, "presence_set")

    async def presence_beat(self, node: str, ttl_ms: int) -> bool:
        """Keep this node's presence entries alive; True when the node was not listed or
        had expired (first beat, or a stall longer than the TTL: a sweep may have taken
        some of its users offline): its users must be recorded again."""
        now = _now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(keys.PRESENCE_NODES, node)
        pipe.zadd(keys.PRESENCE_NODES, {node: now + ttl_ms})
        old, _ = await pipe.execute()
        return old is None or float(old) <= now

    async def presence_sweep(
        self, last_seen_ttl_ms: int, max_users: int, node_ttl_ms: int
    ) -> list[tuple[int, int]]:
        """Take over dead nodes' users and pop the due offlines (``presence_sweep.lua``):
        [(user_id, last_seen)] to announce."""
        args: list[str | int] = [
            *keys.PRESENCE_PIECES,
            _now_ms(),
            last_seen_ttl_ms,
            max_users,
            node_ttl_ms,
        ]
        return parse_offlines(await self._presence_sweep(keys=[keys.PRESENCE_NODES], args=args))

    async def presence_expire(self, node: str) -> None:
        """Mark the node dead now (stopping, or starting again under the same name): the
        next sweep takes its users offline and then drops it."""
        await self.client.zadd(keys.PRESENCE_NODES, {node: 0})

    async def presence_listed(self, node: str) -> bool:
        return await self.client.zscore(keys.PRESENCE_NODES, node) is not None

    async def presence(
        self, user_ids: list[int], node_ttl_ms: int
    ) -> list[tuple[bool, int | None]]:
        """Per user: (online on some live node, last_seen ms or None), in one round trip.
        A user held only by dead nodes that no sweep has taken over yet is offline, last
        seen when the latest of them was last known alive (its last beat: its expiry
        less ``node_ttl_ms``), never "never seen"."""
        now = _now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(keys.PRESENCE_NODES, 0, -1, withscores=True)
        for u in user_ids:
            pipe.smembers(keys.presence_user(u))
            pipe.get(keys.last_seen(u))
        r = await pipe.execute()
        expiry = {node: float(score) for node, score in r[0]}
        out: list[tuple[bool, int | None]] = []
        for i in range(len(user_ids)):
            nodes, seen = r[1 + 2 * i], r[2 + 2 * i]
            held = [expiry[n] for n in nodes if n in expiry]
            if any(e > now for e in held):
                out.append((True, None))
            elif held:  # only dead nodes hold the user: gone when the latest last beat
                beat = int(max(held)) - node_ttl_ms
                out.append((False, beat if 0 < beat <= now else now))
            else:
                out.append((False, None if seen is None else int(seen)))
        return out

    async def connected_devices(self, user_ids: Collection[int]) -> dict[int, set[str]]:
        """Per user asked: its device ids with at least one open WebSocket on a live node
        (an empty set for none). One round trip per ``DEVICES_CHUNK`` users (a pipeline
        of the live nodes and each user's devices hash)."""
        ids = list(dict.fromkeys(user_ids))
        out: dict[int, set[str]] = {}
        for i in range(0, len(ids), DEVICES_CHUNK):
            chunk = ids[i : i + DEVICES_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            pipe.zrangebyscore(keys.PRESENCE_NODES, _now_ms() + 1, "+inf")
            for u in chunk:
                pipe.hgetall(keys.presence_devices(u))
            r = await pipe.execute()
            live = set(r[0])
            for u, raw in zip(chunk, r[1:], strict=True):
                out[u] = parse_live_devices(raw, live)
        return out


DEVICES_CHUNK = 500  # users per round trip of ``connected_devices``


def _now_ms() -> int:
    return int(time.time() * 1000)
