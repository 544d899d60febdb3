"""All Redis commands of the server. Lua lives in ``scripts/*.lua``, loaded once
(``register_script`` re-loads it by itself after a Redis restart)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from im_server.errors import is_store_error
from im_server.storage.redis import keys
from im_server.storage.redis.replies import (
    ScriptReplyError,
    SendDuplicate,
    SendResult,
    dedupe_value,
    join_devices,
    parse_dedupe_value,
    parse_flag,
    parse_int_pair,
    parse_live_devices,
    parse_offlines,
    parse_send,
    parse_user_ids,
)

log = logging.getLogger("im_server.redis")
_SCRIPTS = Path(__file__).parent / "scripts"


class ReplicaWaitError(RedisConnectionError):
    """Sends that could not be shown to have reached a replica before their ack (a store
    failure: ``unavailable``)."""


@dataclass(slots=True)
class SendArgs:
    conv_id: str
    sender_id: int
    client_msg_id: str
    content_type: str
    content_json: str
    server_time: int
    partition: int
    skip_perm: bool = False
    skip_cold: bool = False
    mentions: list[int] = field(default_factory=list)
    mention_all: bool = False
    reply_to: int | None = None


def encode_extras(a: SendArgs) -> str:
    """The fields a plain send leaves out of the script argument (and so of the stream
    entry, which is that argument as it came): NUL, comma-joined mentions, NUL, "1"/"0"
    for mention_all, NUL, reply_to or nothing. Empty for a plain send."""
    if not a.mentions and not a.mention_all and a.reply_to is None:
        return ""
    ids = ",".join(map(str, a.mentions))
    reply = "" if a.reply_to is None else str(a.reply_to)
    return f"\0{ids}\0{'1' if a.mention_all else '0'}\0{reply}"


def _raw(response: Any, **options: Any) -> Any:
    return response


class RedisStore:
    """One client (connection pool; on a Cluster, one per node) plus the scripts; tracks
    each node's run id so a restarted Redis, or a node newly serving some slots, is
    noticed before any command runs on a new connection."""

    def __init__(
        self,
        url: str,
        *,
        dedupe_ttl: int,
        timeout: float = 3.0,
        low_water: int = 500,
        partitions: int = 1,
        cluster: bool = False,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
    ) -> None:
        self.url = url
        self.cluster = cluster
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self._nodes: dict[tuple[str, int], aioredis.Redis] = {}  # a plain client per node
        self.partitions = partitions  # IM_STREAM_PARTITIONS: a conversation's keys carry its tag
        self.dedupe_ttl = dedupe_ttl
        self.low_water = low_water
        self.run_ids: dict[str, str] = {}  # "host:port" -> the run id last seen there
        self.cold_until = 0
        self.run_id_changed = asyncio.Event()
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "redis_connect_func": self._on_connect,
            "max_connections": 64,
            "health_check_interval": 0,
            # one immediate retry (a pooled connection that died with a restarted Redis),
            # then fail: a send must answer `unavailable` fast, not back off for seconds
            "retry": Retry(NoBackoff(), 1),
        }
        # The cluster client offers every command used here under the same names; it
        # routes each by its key (a script by its first key) and follows MOVED and ASK.
        # Typed as the plain client: its stubs are the ones the calls here match.
        self._options = dict(options)
        if cluster:
            hook = options.pop("redis_connect_func")
            rc = RedisCluster.from_url(url, **options)
            # its node connections are made from these (it takes no connect hook itself)
            rc.connection_kwargs["redis_connect_func"] = hook
            self.client: aioredis.Redis = rc  # type: ignore[assignment]
        else:
            self.client = aioredis.Redis.from_url(url, **options)
        # the persister parses stream entries itself (cheaper than the generic callback)
        self.client.set_response_callback("XREADGROUP", _raw)
        self._send = self.client.register_script((_SCRIPTS / "send_batch.lua").read_text())
        self._extend = self.client.register_script((_SCRIPTS / "extend_seq.lua").read_text())
        self._load_perm = self.client.register_script((_SCRIPTS / "load_perm.lua").read_text())
        self._lease = self.client.register_script((_SCRIPTS / "lease.lua").read_text())
        self._take = self.client.register_script((_SCRIPTS / "attempt_take.lua").read_text())
        self._give = self.client.register_script((_SCRIPTS / "attempt_give.lua").read_text())
        self._presence_set = self.client.register_script(
            (_SCRIPTS / "presence_set.lua").read_text()
        )
        self._presence_sweep = self.client.register_script(
            (_SCRIPTS / "presence_sweep.lua").read_text()
        )
        self._boot = self.client.register_script((_SCRIPTS / "boot.lua").read_text())
        self._nodes_of = self.client.register_script((_SCRIPTS / "nodes_of.lua").read_text())

    async def _on_connect(self, conn: Connection) -> None:
        await conn.on_connect()
        await conn.send_command("INFO", "server")
        info = await conn.read_response()
        text = info.decode() if isinstance(info, bytes) else str(info)
        node = f"{conn.host}:{conn.port}"
        for line in text.splitlines():
            if line.startswith("run_id:"):
                rid = line.split(":", 1)[1].strip()
                old = self.run_ids.get(node)
                if rid != old:
                    if old:
                        log.warning("redis %s restarted (run id %s -> %s)", node, old, rid)
                    self.run_ids[node] = rid
                    self.run_id_changed.set()  # look at the boot markers again
                break

    async def pubsub(self) -> PubSub:
        """A listening connection. On a Cluster the client first learns the slot map (its
        pub/sub picks a node from it); classic channels reach every node there."""
        if self.cluster:
            await self.client.initialize()
        return self.client.pubsub(ignore_subscribe_messages=True)

    def part(self, conv_id: str) -> int:
        """The partition whose tag the conversation's keys carry."""
        return keys.partition_of(conv_id, self.partitions)

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.aclose()
        await self.client.aclose()

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    # ---- send ----------------------------------------------------------------------------

    async def send_many(self, items: list[SendArgs]) -> list[SendResult]:
        """Run the atomic send script (``send_batch.lua``) for all items: one call per
        stream partition in the batch (one round trip when they share one), answers in
        the items' order. A reply off the script's contract raises ScriptReplyError."""
        cold = "1" if self.cold_until > time.time() * 1000 else "0"
        by_part: dict[int, list[int]] = {}
        for i, a in enumerate(items):
            by_part.setdefault(a.partition, []).append(i)
        if len(by_part) == 1:
            return await self._send_part(items[0].partition, items, cold)
        answers: dict[int, SendResult] = {}
        for part, idxs in by_part.items():
            res = await self._send_part(part, [items[i] for i in idxs], cold)
            answers.update(zip(idxs, res, strict=True))
        return [answers[i] for i in range(len(items))]

    async def _send_part(self, part: int, items: list[SendArgs], cold: str) -> list[SendResult]:
        v: list[str | int] = [cold, self.dedupe_ttl, self.low_water]
        v.extend(keys.send_key_pieces(part))
        for a in items:
            v.append(
                f"{a.conv_id}\0{a.sender_id}\0{a.client_msg_id}\0{a.content_type}\0{a.content_json}\0"
                f"{a.server_time}\0{'1' if a.skip_perm else '0'}\0{'1' if a.skip_cold else '0'}"
                + encode_extras(a)
            )
        script_keys = [keys.stream(part), keys.boot(part)]
        if self.wait_replicas:
            res = await self._send_and_wait(script_keys, v)
        else:
            res = await self._send(keys=script_keys, args=v)
        if not isinstance(res, list) or len(res) != len(items):
            raise ScriptReplyError(f"send script: {len(items)} answers expected, got {res!r:.200}")
        return [parse_send(r) for r in res]

    async def _send_and_wait(self, script_keys: list[str], args: list[str | int]) -> Any:
        """The send script, then ``WAIT``, on one connection to the primary serving the
        partition: ``WAIT`` counts the writes of its own connection, so only this order
        on one connection says that the sends reached a replica before they are acked.
        Too few replicas in time: ``ReplicaWaitError`` (answered ``unavailable``; the
        client's retry of the same client_msg_id gets the first ack, or, if the writes
        were lost with their primary, is sent anew). A stale slot map (``MOVED``) is
        learnt again and the call made once more; a slot half-way through a move
        (``ASK``: the partition's keys already on the target) is followed with
        ``ASKING`` on a connection to the target, once. A move that has some of the
        keys on each side (``TRYAGAIN``) is a store error: answered ``unavailable``."""
        ask: tuple[str, int] | None = None
        for _attempt in range(3):
            if ask is not None:
                client = self._client_at(ask)
            else:
                client = await self._primary_for(script_keys[0])
            pipe = client.pipeline(transaction=False)
            if ask is not None:
                pipe.execute_command("ASKING")
            pipe.evalsha(self._send.sha, len(script_keys), *script_keys, *args)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            try:
                *_, res, acked = await pipe.execute()
            except NoScriptError:
                await client.script_load(self._send.script)
                continue
            except MovedError:  # (a MovedError is an AskError: this goes first)
                if not self.cluster:
                    raise
                await self.refresh_map()
                ask = None
                continue
            except AskError as e:
                if not self.cluster or ask is not None:
                    raise
                ask = (str(e.host), int(e.port))
                continue
            except ResponseError as e:
                if self.cluster and is_store_error(e):  # a demoted primary (READONLY)
                    await self.refresh_map()
                raise
            except RedisConnectionError:
                if self.cluster:  # its primary is gone: the next call asks for the new map
                    await self.refresh_map()
                raise
            if int(acked) < self.wait_replicas:
                raise ReplicaWaitError(
                    f"{acked} of {self.wait_replicas} replicas took the sends in "
                    f"{self.wait_timeout_ms} ms"
                )
            return res
        raise ReplicaWaitError("the send script could not be run on the partition's primary")

    async def _primary_for(self, key: str) -> aioredis.Redis:
        """A plain client to the primary serving ``key`` (the single Redis otherwise)."""
        if not self.cluster:
            return self.client
        rc = self._cluster()
        await rc.initialize()  # the map is learnt on first use (a no-op after)
        node = rc.get_node_from_key(key)
        if node is None:
            raise ReplicaWaitError(f"no node serves the slot of {key}")
        return self._client_at((str(node.host), int(node.port)))

    def _client_at(self, addr: tuple[str, int]) -> aioredis.Redis:
        """A plain client to the cluster node at ``addr`` (made once, kept)."""
        client = self._nodes.get(addr)
        if client is None:
            conn = parse_url(self.url)
            options = {**self._options, **{k: v for k, v in conn.items() if k != "db"}}
            options.update(host=addr[0], port=addr[1])
            client = self._nodes[addr] = aioredis.Redis(**options)
        return client

    async def refresh_map(self) -> None:
        """Learn the Cluster's slot map again (a no-op on a single Redis)."""
        if not self.cluster:
            return
        try:
            await self._cluster().nodes_manager.initialize()
        except Exception as e:  # noqa: BLE001 - the cluster is down: the next call tries again
            log.debug("refreshing the cluster map failed: %r", e)

    def _cluster(self) -> RedisCluster:
        assert isinstance(self.client, RedisCluster)
        return self.client

    async def extend_seq(
        self, conv_id: str, old_reserved: int, new_reserved: int
    ) -> tuple[int, int]:
        """Install the seq block (old_reserved, new_reserved] (``extend_seq.lua``):
        (cur, lim) after the change."""
        r = await self._extend(
            keys=[keys.seq(self.part(conv_id), conv_id)],
            args=[old_reserved, new_reserved],
        )
        return parse_int_pair(r, "extend_seq")

    async def lock_seq(self, conv_id: str, owner: str, ttl_ms: int = 5000) -> bool:
        key = keys.seq_lock(self.part(conv_id), conv_id)
        return bool(await self.client.set(key, owner, nx=True, px=ttl_ms))

    async def unlock_seq(self, conv_id: str) -> None:
        await self.client.delete(keys.seq_lock(self.part(conv_id), conv_id))

    async def current_seq(self, conv_id: str) -> int | None:
        """The last seq handed out for the conversation, or None when Redis holds no counter."""
        cur = await self.client.hget(keys.seq(self.part(conv_id), conv_id), "cur")
        return int(cur) if cur is not None else None

    async def current_seqs(self, conv_ids: list[str]) -> dict[str, int]:
        """The last seq handed out per conversation, for those Redis has a counter for."""
        pipe = self.client.pipeline(transaction=False)
        for c in conv_ids:
            pipe.hget(keys.seq(self.part(c), c), "cur")
        out = {}
        for c, v in zip(conv_ids, await pipe.execute(), strict=True):
            if v is not None:
                out[c] = int(v)
        return out

    async def set_dedupe(
        self,
        to_conv: str,
        sender_id: int,
        client_msg_id: str,
        conv_id: str,
        seq: int,
        server_time: int,
    ) -> None:
        """Remember where (sender, client_msg_id) went (``conv_id``, ``seq``), as the send
        script does, in the partition of ``to_conv``, the conversation this send names:
        where its next repeat looks."""
        await self.client.set(
            keys.dedupe(self.part(to_conv), sender_id, client_msg_id),
            dedupe_value(conv_id, seq, server_time),
            ex=self.dedupe_ttl,
        )

    async def get_dedupe(
        self, conv_id: str, sender_id: int, client_msg_id: str
    ) -> SendDuplicate | None:
        """Where (sender, client_msg_id) went, if Redis remembers it in the partition of
        ``conv_id`` (where a repeat of the send to that conversation finds it)."""
        raw = await self.client.get(keys.dedupe(self.part(conv_id), sender_id, client_msg_id))
        return None if raw is None else parse_dedupe_value(raw)

    # ---- boot marker / cold dedupe window -------------------------------------------------

    async def boot_markers(self, write: bool = False) -> list[tuple[str | None, str]]:
        """Per partition: (its boot marker, None where missing; the run id of the node
        serving it), read in its node by ``boot.lua``; with ``write``, the markers are
        set to those run ids. One call per partition, all in flight at once (script
        calls cannot share a pipeline on a Cluster)."""
        mode = "set" if write else "get"
        answers = await asyncio.gather(
            *(self._boot(keys=[keys.boot(p)], args=[mode]) for p in range(self.partitions))
        )
        out: list[tuple[str | None, str]] = []
        for a in answers:
            if not (isinstance(a, list) and len(a) == 2):
                raise ScriptReplyError(f"boot script: a pair expected, got {a!r:.200}")
            out.append((str(a[0]) or None, str(a[1])))
        return out

    async def set_cold_until(self, until_ms: int) -> None:
        await self.client.set(keys.COLD_UNTIL, until_ms)

    async def refresh_cold_until(self) -> int:
        v = await self.client.get(keys.COLD_UNTIL)
        self.cold_until = int(v) if v else 0
        return self.cold_until

    # ---- permissions cache ----------------------------------------------------------------

    async def load_perm(self, conv_id: str, epoch: str, statuses: dict[int, str], ttl: int) -> bool:
        args: list[Any] = [epoch, ttl]
        for uid, st in statuses.items():
            args.extend((uid, st))
        p = self.part(conv_id)
        r = await self._load_perm(
            keys=[keys.perm(p, conv_id), keys.perm_epoch(p, conv_id)], args=args
        )
        return parse_flag(r, "load_perm")

    async def perm_status(self, conv_id: str, user_id: int) -> str | None:
        """The cached send permission: 'ok', a refusal code, 'not_member' when the cache
        is loaded without the user, None when the cache is cold."""
        key = keys.perm(self.part(conv_id), conv_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(key, str(user_id))
        pipe.hexists(key, "_l")
        st, loaded = await pipe.execute()
        if st is not None:
            return str(st)
        return "not_member" if loaded else None

    async def perm_epoch(self, conv_id: str) -> str:
        return str(await self.client.get(keys.perm_epoch(self.part(conv_id), conv_id)) or "0")

    async def invalidate_perm(self, conv_ids: list[str]) -> None:
        """Called after a change committed in PostgreSQL: bump the epoch, drop the hash."""
        if not conv_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for c in conv_ids:
            p = self.part(c)
            pipe.incr(keys.perm_epoch(p, c))
            pipe.delete(keys.perm(p, c))
        await pipe.execute()

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
        now = _now_ms()
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

    async def node_client(self, key: str) -> aioredis.Redis:
        """A plain client to the node serving ``key``'s slot (the single Redis otherwise):
        sharded pub/sub listens on the shard of its channel."""
        return await self._primary_for(key)

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
