"""The before-send hook's decisions, one key per (sender, client_msg_id) (a part of
:class:`RedisStore`)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from im_server.storage.redis import keys


class DecisionOps:
    client: aioredis.Redis

    async def send_decision(self, sender_id: int, client_msg_id: str) -> bytes | None:
        return _bytes(await self.client.get(keys.send_decision(sender_id, client_msg_id)))

    async def send_decisions(self, sends: list[tuple[int, str]]) -> list[bytes | None]:
        """The kept decisions of many sends, in one pipeline (one round trip per node)."""
        pipe = self.client.pipeline(transaction=False)
        for sender_id, cmid in sends:
            pipe.get(keys.send_decision(sender_id, cmid))
        return [_bytes(v) for v in await pipe.execute()]

    async def keep_send_decisions(self, items: list[tuple[int, str, bytes, int]]) -> list[bytes]:
        """:meth:`keep_send_decision` of many sends, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for sender_id, cmid, decision, ttl_s in items:
            pipe.set(keys.send_decision(sender_id, cmid), decision, ex=ttl_s, nx=True, get=True)
        try:
            found = await pipe.execute()
        except ResponseError:  # before Redis 7: one at a time
            return [await self.keep_send_decision(*item) for item in items]
        return [
            earlier if (earlier := _bytes(v)) is not None else item[2]
            for v, item in zip(found, items, strict=True)
        ]

    async def keep_send_decision(
        self, sender_id: int, client_msg_id: str, decision: bytes, ttl_s: int
    ) -> bytes:
        """Keep ``decision`` unless one is kept already; the one kept (two sends of one
        message at once both asked the hook: the first answer stored wins)."""
        key = keys.send_decision(sender_id, client_msg_id)
        try:
            earlier = _bytes(await self.client.set(key, decision, ex=ttl_s, nx=True, get=True))
        except ResponseError:  # before Redis 7, SET takes NX or GET, not both
            if await self.client.set(key, decision, ex=ttl_s, nx=True):
                return decision
            earlier = _bytes(await self.client.get(key))
        return earlier if earlier is not None else decision


def _bytes(value: object) -> bytes | None:
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None
