"""All Redis commands of the server. Lua lives in ``scripts/*.lua``, loaded once
(``register_script`` re-loads it by itself after a Redis restart)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from im_server.storage.redis import keys
from im_server.storage.redis.acked_sends import AckedSends, AckWithoutReplica
from im_server.storage.redis.acked_sends import ReplicaWaitError as ReplicaWaitError
from im_server.storage.redis.decision_ops import DecisionOps
from im_server.storage.redis.perm_ops import PermOps
from im_server.storage.redis.presence_ops import DEVICES_CHUNK as DEVICES_CHUNK
from im_server.storage.redis.presence_ops import PresenceOps
from im_server.storage.redis.rate_ops import RateOps
from im_server.storage.redis.registry_ops import RegistryOps
from im_server.storage.redis.replies import (
    ScriptReplyError,
    SendDuplicate,
    SendResult,
    dedupe_value,
    parse_dedupe_value,
    parse_int_pair,
    parse_send,
)
from im_server.storage.redis.stream_ops import StreamOps

log = logging.getLogger("im_server.redis")
_SCRIPTS = Path(__file__).parent / "scripts"


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


class RedisStore(AckedSends, PermOps, StreamOps, RegistryOps, PresenceOps, RateOps, DecisionOps):
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
        ack_without_replica: AckWithoutReplica = "aof",
    ) -> None:
        self.url = url
        self.cluster = cluster
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.ack_without_replica: AckWithoutReplica = ack_without_replica
        self._nodes: dict[tuple[str, int], aioredis.Redis] = {}  # a plain client per node
        self._down: dict[tuple[str, int], float] = {}  # primary -> no send there until
        self._refreshing = asyncio.Lock()
        self._refreshed_at = 0.0
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
        self._rate_take = self.client.register_script((_SCRIPTS / "rate_take.lua").read_text())
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

    async def node_client(self, key: str) -> aioredis.Redis:
        """A plain client to the node serving ``key``'s slot (the single Redis otherwise):
        sharded pub/sub listens on the shard of its channel."""
        addr, _replicas = await self._primary_of(key)
        return self._client_at(addr)

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
        if self.wait_replicas or self.cluster:  # (a cluster: its own routing, down marks)
            res = await self._send_and_wait(script_keys, v)
        else:
            res = await self._send(keys=script_keys, args=v)
        if not isinstance(res, list) or len(res) != len(items):
            raise ScriptReplyError(f"send script: {len(items)} answers expected, got {res!r:.200}")
        return [parse_send(r) for r in res]

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
