"""The send script on a Redis Cluster, and what its ack waits for (a part of
:class:`RedisStore`).

- **What an ack waits for.** With a replica attached to the partition's primary (as
  the slot map shows it), the script's writes must reach ``wait_replicas`` replicas
  (``WAIT`` on the script's own connection). A primary without one (its replica was
  promoted after a fail-over and the lost node has not come back) takes, by default,
  its own AOF fsync instead (``WAITAOF 1 0``): acks go on, and an acked send survives a
  crash of that primary (it is on its disk) while at most one node of the shard is
  down. ``IM_REDIS_ACK_WITHOUT_REPLICA=refuse`` answers ``unavailable`` there instead
  (acks only once a replica holds the send, at the price of the shard's availability
  until a replica is back).
- **A shard that fails stops taking sends at once.** A connection error on a primary
  marks its address down for ``DOWN_S``: sends to its partitions are answered
  ``unavailable`` without another attempt, and the slot map is learnt again (one
  refresh at a time), so the partitions follow their promoted replica as soon as the
  cluster has one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from im_server.errors import is_store_error

log = logging.getLogger("im_server.redis")

DOWN_S = 1.0  # a primary that failed a call takes no send for this long
MAP_REFRESH_MIN_S = 0.2  # refreshes of the slot map asked for at once are one
AOF_WAIT_MIN_MS = 1500  # an AOF fsynced once a second needs up to a second to answer
AckWithoutReplica = Literal["aof", "refuse"]


class ReplicaWaitError(RedisConnectionError):
    """Sends that could not be shown durable before their ack (too few replicas, no
    fsync, or a shard marked down): a store failure, answered ``unavailable``."""


class AckedSends:
    """The cluster side of the send (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    cluster: bool
    url: str
    wait_replicas: int
    wait_timeout_ms: int
    ack_without_replica: AckWithoutReplica
    _options: dict[str, Any]
    _nodes: dict[tuple[str, int], aioredis.Redis]
    _down: dict[tuple[str, int], float]
    _refreshing: asyncio.Lock
    _refreshed_at: float
    _send: AsyncScript

    async def _send_and_wait(self, script_keys: list[str], args: list[str | int]) -> Any:
        """The send script, then ``WAIT`` (or ``WAITAOF``), on one connection to the
        primary serving the partition: both count the writes of their own connection, so
        only this order on one connection says the sends are durable before they are
        acked. Not durable in time: ``ReplicaWaitError`` (the client's retry of the same
        client_msg_id gets the first ack, or, if the writes were lost with their
        primary, is sent anew). A stale slot map (``MOVED``) is learnt again and the
        call made once more; a slot half-way through a move (``ASK``: the partition's
        keys already on the target) is followed with ``ASKING`` on a connection to the
        target, once. A move that has some of the keys on each side (``TRYAGAIN``) is a
        store error: answered ``unavailable``."""
        ask: tuple[str, int] | None = None
        for _attempt in range(3):
            if ask is not None:
                addr, replicas = ask, self.wait_replicas
            else:
                addr, replicas = await self._primary_of(script_keys[0])
            client = self._client_at(addr)
            aof = replicas < self.wait_replicas and self.ack_without_replica == "aof"
            pipe = client.pipeline(transaction=False)
            if ask is not None:
                pipe.execute_command("ASKING")
            pipe.evalsha(self._send.sha, len(script_keys), *script_keys, *args)
            if aof:
                pipe.execute_command("WAITAOF", 1, 0, max(AOF_WAIT_MIN_MS, self.wait_timeout_ms))
            else:
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            try:
                *_, res, waited = await pipe.execute()
            except NoScriptError:
                await client.script_load(self._send.script)
                continue
            except MovedError:  # (a MovedError is an AskError: this goes first)
                if not self.cluster:
                    raise
                await self.refresh_map(force=True)
                ask = None
                continue
            except AskError as e:
                if not self.cluster or ask is not None:
                    raise
                ask = (str(e.host), int(e.port))
                continue
            except ResponseError as e:
                if self.cluster and is_store_error(e):  # a demoted primary (READONLY)
                    await self.refresh_map(force=True)
                raise
            except (RedisConnectionError, RedisTimeoutError):
                if self.cluster:  # its primary is gone: no send there for a while
                    self._down[addr] = time.monotonic() + DOWN_S
                    await self.refresh_map(force=True)
                raise
            if aof:
                if int(waited[0]) < 1:
                    raise ReplicaWaitError("the primary (no replica) did not fsync the sends")
            elif int(waited) < self.wait_replicas:
                if self.cluster:  # a replica gone: the map may say so by now
                    await self.refresh_map()
                raise ReplicaWaitError(
                    f"{waited} of {self.wait_replicas} replicas took the sends in "
                    f"{self.wait_timeout_ms} ms"
                )
            return res
        raise ReplicaWaitError("the send script could not be run on the partition's primary")

    async def _primary_of(self, key: str) -> tuple[tuple[str, int], int]:
        """The address of the primary serving ``key`` and how many replicas the slot map
        gives it (the single Redis: its address, and replicas assumed attached). A
        primary marked down answers ``ReplicaWaitError`` at once."""
        if not self.cluster:
            return ("", 0), self.wait_replicas
        rc = self._cluster()
        await rc.initialize()  # the map is learnt on first use (a no-op after)
        nodes = rc.nodes_manager.slots_cache.get(rc.keyslot(key))
        if not nodes:
            await self.refresh_map()
            raise ReplicaWaitError(f"no node serves the slot of {key}")
        addr = (str(nodes[0].host), int(nodes[0].port))
        until = self._down.get(addr)
        if until is not None:
            if time.monotonic() < until:
                raise ReplicaWaitError(f"the primary at {addr[0]}:{addr[1]} is down")
            del self._down[addr]
        return addr, len(nodes) - 1

    def _client_at(self, addr: tuple[str, int]) -> aioredis.Redis:
        """A plain client to the node at ``addr`` (made once, kept); the single Redis's
        own client."""
        if not self.cluster:
            return self.client
        client = self._nodes.get(addr)
        if client is None:
            conn = parse_url(self.url)
            options = {**self._options, **{k: v for k, v in conn.items() if k != "db"}}
            options.update(host=addr[0], port=addr[1])
            client = self._nodes[addr] = aioredis.Redis(**options)
        return client

    async def refresh_map(self, force: bool = False) -> None:
        """Learn the Cluster's slot map again (a no-op on a single Redis). Callers that
        ask at once share one refresh; without ``force`` one made in the last
        ``MAP_REFRESH_MIN_S`` is enough."""
        if not self.cluster:
            return
        asked_at = time.monotonic()
        async with self._refreshing:
            if self._refreshed_at >= asked_at or (
                not force and asked_at - self._refreshed_at < MAP_REFRESH_MIN_S
            ):
                return  # another caller refreshed while this one waited
            rc = self._cluster()
            try:
                await rc.nodes_manager.initialize()
                # the client asks one node for the keys of commands such as XREADGROUP
                # (COMMAND GETKEYS); it keeps asking the node it first chose, dead or not,
                # unless pointed at another one (the map's default node, once that changed)
                default = rc.get_default_node()
                asked = getattr(rc.commands_parser, "node", None)
                if asked is None or asked.name != default.name:
                    await rc.commands_parser.initialize(default)
            except Exception as e:  # noqa: BLE001 - the cluster is down: the next call tries again
                log.debug("refreshing the cluster map failed: %r", e)
            self._refreshed_at = time.monotonic()

    def _cluster(self) -> RedisCluster:
        assert isinstance(self.client, RedisCluster)
        return self.client
