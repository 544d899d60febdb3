"""Per-user rate buckets in Redis, shared by every server process (a part of
:class:`RedisStore`). Used once a user's requests may reach more than one process
(``context/limits.py``)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from im_server.storage.redis import keys
from im_server.storage.redis.replies import ScriptReplyError

RateAsk = tuple[str, int, float, float, int]  # (kind, user_id, rate per s, burst, tokens)


class RateOps:
    """Shared token buckets (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    _rate_take: AsyncScript

    async def take_rates(self, asks: list[RateAsk]) -> list[int]:
        """Up to the asked tokens from each bucket: how many were granted. One script
        call per hash tag among the asks (one on a single Redis, a few on a Cluster),
        all at once."""
        by_tag: dict[int, list[int]] = {}
        for i, (_kind, user_id, _rate, _burst, _n) in enumerate(asks):
            by_tag.setdefault(keys.rate_tag(user_id), []).append(i)
        groups = list(by_tag.values())
        replies = await asyncio.gather(
            *(
                self._rate_take(
                    keys=[keys.rate_bucket(asks[i][0], asks[i][1]) for i in idxs],
                    args=[v for i in idxs for v in (asks[i][2], asks[i][3], asks[i][4])],
                )
                for idxs in groups
            )
        )
        out = [0] * len(asks)
        for idxs, reply in zip(groups, replies, strict=True):
            if not isinstance(reply, list) or len(reply) != len(idxs):
                raise ScriptReplyError(f"rate_take: {len(idxs)} answers expected: {reply!r:.100}")
            for i, granted in zip(idxs, reply, strict=True):
                out[i] = int(granted)
        return out
