"""What the send script reads beside the seqs: the boot markers (has this Redis lost its
data?) and the cache of who may send where. A part of :class:`RedisStore`."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from im_server.storage.redis import keys
from im_server.storage.redis.replies import ScriptReplyError, parse_flag


class PermOps:
    """Boot markers and the permissions cache (mixed into :class:`RedisStore`)."""

    client: aioredis.Redis
    _boot: AsyncScript
    _load_perm: AsyncScript
    cold_until: int

    partitions: int

    def part(self, conv_id: str) -> int:
        """The partition whose tag the conversation's keys carry."""
        return keys.partition_of(conv_id, self.partitions)

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
