"""Which gateway process holds which user (a registry with expiry, read by the fan-out
across processes), the processes' heartbeats, and who is long-polling. A part of
:class:`RedisStore`."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from im_server.storage.redis import keys


class RegistryOps:
    """Nodes, the user registry and long polls (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    cluster: bool
    _nodes_of: AsyncScript

    # ---- nodes and pub/sub ----------------------------------------------------------------

    async def heartbeat(self, node: str, ttl_ms: int) -> list[str]:
        """Register this node and return every live node (self included)."""
        now = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(keys.NODES, {node: now + ttl_ms})
        pipe.zremrangebyscore(keys.NODES, 0, now)
        pipe.zrange(keys.NODES, 0, -1)
        r = await pipe.execute()
        return list(r[2])

    async def leave(self, node: str) -> None:
        await self.client.zrem(keys.NODES, node)

    async def register_users(self, node: str, user_ids: Sequence[int], ttl_ms: int) -> None:
        """List ``node`` as holding each of the users for ``ttl_ms`` (the registry that
        routes frames to gateway inboxes), dropping entries that have expired. One
        pipeline: on a Cluster it goes to the users' shards in parallel. Every node uses
        the same TTL, so the key's own TTL, set by the latest write, outlives its entries."""
        if not user_ids:
            return
        now = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=False)
        for u in user_ids:
            key = keys.user_nodes(u)
            pipe.zadd(key, {node: now + ttl_ms})
            pipe.zremrangebyscore(key, 0, now)
            pipe.pexpire(key, ttl_ms)
        await pipe.execute()

    # ---- the sockets of a user, on every node -----------------------------------------------

    async def claim_socket(self, user_id: int, node: str, live: set[str], cap: int) -> bool:
        """Count one more socket of the user on ``node`` unless the user already holds
        ``cap`` on the live nodes together (then nothing changes). Counts of nodes that
        are no longer live are dropped on the way (a crashed process's)."""
        key = keys.user_sockets(user_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hincrby(key, node, 1)
        pipe.hgetall(key)
        _, counts = await pipe.execute()
        held, dead = 0, []
        for n, c in counts.items():
            if n == node or n in live:
                held += int(c)
            else:
                dead.append(n)
        if dead:
            await self.client.hdel(key, *dead)
        if held > cap:
            await self.release_socket(user_id, node)
            return False
        return True

    async def release_socket(self, user_id: int, node: str) -> None:
        """One socket of the user on ``node`` fewer."""
        key = keys.user_sockets(user_id)
        if int(await self.client.hincrby(key, node, -1)) <= 0:
            await self.client.hdel(key, node)

    async def unregister_user(self, node: str, user_id: int) -> None:
        await self.client.zrem(keys.user_nodes(user_id), node)

    async def nodes_of(self, user_ids: Sequence[int], origin: str) -> dict[int, list[str]]:
        """Per user, the nodes other than ``origin`` listed as holding it now (users on no
        other node left out). On a single Redis one script call (``nodes_of.lua``): a
        big group's frame asks for thousands of users, and a pipeline command each
        costs this process more than the lookups cost Redis. On a Cluster, where the
        users' entries lie in many slots, one pipeline."""
        if not user_ids:
            return {}
        now = int(time.time() * 1000)
        out: dict[int, list[str]] = {}
        if not self.cluster:
            users = ",".join(map(str, user_ids))
            flat = await self._nodes_of(args=[keys.USER_NODES, now, origin, users])
            for i in range(0, len(flat), 2):
                out.setdefault(int(flat[i]), []).append(str(flat[i + 1]))
            return out
        pipe = self.client.pipeline(transaction=False)
        for u in user_ids:
            pipe.zrangebyscore(keys.user_nodes(u), now, "+inf")
        for u, nodes in zip(user_ids, await pipe.execute(), strict=True):
            others = [str(n) for n in nodes if n != origin]
            if others:
                out[u] = others
        return out

    async def register_long_poll(self, user_id: int, ttl_ms: int) -> None:
        await self.client.zadd(keys.LONG_POLLS, {str(user_id): int(time.time() * 1000) + ttl_ms})

    async def long_polling(self, user_ids: list[int]) -> list[int]:
        """Those of the users with a live long poll somewhere."""
        now = time.time() * 1000
        scores = await self.client.zmscore(keys.LONG_POLLS, [str(u) for u in user_ids])
        return [u for u, s in zip(user_ids, scores, strict=True) if s is not None and s > now]

    async def any_long_polls(self) -> bool:
        return bool(await self.client.zcount(keys.LONG_POLLS, int(time.time() * 1000), "+inf"))

    async def expire_long_polls(self) -> None:
        await self.client.zremrangebyscore(keys.LONG_POLLS, 0, int(time.time() * 1000))
