"""The durable queue as the persister sees it (one stream per partition, a lease per
partition, a consumer group), and the attempt counters of logins, lookups and sign-ups.
A part of :class:`RedisStore`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from im_server.storage.redis import keys
from im_server.storage.redis.replies import parse_flag


class StreamOps:
    """Streams and attempt counters (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    _lease: AsyncScript
    _take: AsyncScript
    _give: AsyncScript

    # ---- the partition count ---------------------------------------------------------------

    async def recorded_partitions(self) -> int | None:
        """The partition count this keyspace was made with, if recorded."""
        v = await self.client.get(keys.PARTITIONS)
        return None if v is None else int(v)

    async def full_coverage_required(self) -> bool | None:
        """A Cluster's ``cluster-require-full-coverage`` (yes: every node refuses every
        command while any slot has no live primary); None where CONFIG is not allowed."""
        name = "cluster-require-full-coverage"
        value = await self._one_node_field(self.client.config_get(name), name)
        return None if value is None else value.lower() == "yes"

    async def server_version(self) -> str | None:
        """The server's ``redis_version`` (on a Cluster, one node's); None where INFO is
        refused or does not say."""
        return await self._one_node_field(self.client.info("server"), "redis_version")

    @staticmethod
    async def _one_node_field(reply: Awaitable[Any], name: str) -> str | None:
        """Field ``name`` of a CONFIG GET or INFO reply: a dict, or on a Cluster perhaps
        one per node (or a list of them); None where the command is renamed away or
        refused, or the reply does not say."""
        try:
            got: Any = await reply
        except Exception:  # noqa: BLE001 - the command is refused: nothing to say
            return None
        while isinstance(got, dict) and name not in got and got:
            got = next(iter(got.values()))
        if isinstance(got, list) and got:
            got = got[0]
        value = got.get(name) if isinstance(got, dict) else None
        return None if value is None else str(value)

    async def has_streams(self) -> bool:
        """Whether this keyspace already holds the durable queue (made before the count
        was recorded: partition 0's stream exists whatever the count was)."""
        return bool(await self.client.exists(keys.stream(0)))

    async def record_partitions(self, count: int) -> int:
        """Record ``count`` unless a count is recorded already; the recorded one either
        way (processes starting at once agree on the first)."""
        await self.client.set(keys.PARTITIONS, count, nx=True)
        v = await self.client.get(keys.PARTITIONS)
        return int(v) if v is not None else count

    # ---- stream (persister) ---------------------------------------------------------------

    async def lease(self, partition: int, owner: str, ttl_ms: int, release: bool = False) -> bool:
        """Take or renew (or release) the partition's persister lease; True when held."""
        r = await self._lease(
            keys=[keys.persister_lease(partition)], args=[owner, ttl_ms, "1" if release else "0"]
        )
        return parse_flag(r, "lease")

    async def ensure_group(self, partition: int) -> None:
        try:
            await self.client.xgroup_create(
                keys.stream(partition), keys.GROUP, id="0", mkstream=True
            )
        except aioredis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def read_group(
        self, partitions: list[int], consumer: str, count: int, block_ms: int, pending: bool = False
    ) -> list[tuple[str, list[tuple[str, list[str] | None]]]]:
        """[(stream, [(entry id, [field, value, ...] or None if deleted)])]."""
        streams: dict[Any, Any] = {keys.stream(p): ("0" if pending else ">") for p in partitions}
        r = await self.client.xreadgroup(
            keys.GROUP, consumer, streams, count=count, block=None if pending else block_ms
        )
        if isinstance(r, dict):  # redis-py 8 shapes the reply as {stream: entries}
            return list(r.items())  # type: ignore[arg-type]
        return list(r or [])  # type: ignore[arg-type]

    async def autoclaim(
        self, partition: int, consumer: str, min_idle_ms: int, count: int, start: str = "0-0"
    ) -> tuple[str, list[tuple[str, Any]]]:
        """Claim pending entries idle at least ``min_idle_ms``, from ``start``: (next start
        id, "0-0" when done; [(id, fields or None if deleted)])."""
        r = await self.client.xautoclaim(
            keys.stream(partition), keys.GROUP, consumer, min_idle_ms, start_id=start, count=count
        )
        # Redis 6.2 answers [next, entries], Redis 7 [next, entries, deleted]
        if not r:
            return "0-0", []
        return str(r[0]), [(e[0], e[1]) for e in r[1] if e]

    async def ack(self, stream_key: str, ids: list[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream_key, keys.GROUP, *ids)
        pipe.xdel(stream_key, *ids)
        await pipe.execute()

    async def stream_depth(self, partitions: int) -> int:
        pipe = self.client.pipeline(transaction=False)
        for p in range(partitions):
            pipe.xlen(keys.stream(p))
        return sum(int(x) for x in await pipe.execute())

    # ---- attempt counters (failed logins) ---------------------------------------------------

    async def take_attempts(self, limits: list[tuple[str, int]], window_s: int) -> list[bool]:
        """Count one attempt on each ``(key, limit)`` counter in turn, atomically per
        counter (``attempt_take.lua``), stopping at the first whose limit was already
        reached; per counter, True when counted, False when refused or not reached.

        Why in turn, not at once: the counters sit in different slots on a Cluster, so
        no one script can take them all. Taken at once, a burst refused by its first
        counter would still count on the second for a moment, and a rightful attempt
        could be refused there by attempts that were never going to be checked."""
        taken: list[bool] = []
        for key, limit in limits:
            ok = parse_flag(await self._take(keys=[key], args=[limit, window_s]), "attempt_take")
            taken.append(ok)
            if not ok:
                break
        return taken + [False] * (len(limits) - len(taken))

    async def settle_attempts(self, give: list[str], clear: list[str]) -> None:
        """Give an attempt back on the ``give`` counters (``attempt_give.lua``) and drop
        the ``clear`` counters, all in flight at once (one key per command: the counters
        sit in different slots)."""
        await asyncio.gather(
            *(self._give(keys=[key], args=[]) for key in give),
            *(self.client.delete(key) for key in clear),
        )
