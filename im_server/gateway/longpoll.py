"""Long polls of this process: a waiter per pending ``GET /v1/sync?wait=``. A waiting
user is listed in Redis (with an expiry, ``RedisStore.register_long_poll``) and this
process listens on the user's channel, so a change committed by any process wakes it.
This is the gateway's ``SyncWaker`` (see ``context.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable

from im_server.context import Woken
from im_server.gateway.fanout import Fanout
from im_server.storage.redis.store import RedisStore

log = logging.getLogger("im_server.longpoll")
REGISTRATION_MS = 40_000


class LongPolls:
    def __init__(self, fanout: Fanout, redis: RedisStore) -> None:
        self.fanout = fanout
        self.redis = redis
        self.waiters: dict[int, set[asyncio.Event]] = {}

    def has(self, user_id: int) -> bool:
        return user_id in self.waiters

    def count(self, user_id: int) -> int:
        return len(self.waiters.get(user_id, ()))

    def waiting_any(self) -> bool:
        return bool(self.waiters)

    @contextlib.asynccontextmanager
    async def waiting(self, user_id: int) -> AsyncIterator[Woken]:
        ev = asyncio.Event()
        first = user_id not in self.waiters
        self.waiters.setdefault(user_id, set()).add(ev)

        async def woken(timeout: float) -> None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout)

        try:
            if first:
                await self.fanout.subscribe_user(user_id)
                try:
                    await self.redis.register_long_poll(user_id, REGISTRATION_MS)
                except Exception as e:  # noqa: BLE001 - local wakes still work
                    log.debug("registering the long poll of user %d failed: %r", user_id, e)
            yield woken
        finally:
            evs = self.waiters.get(user_id)
            if evs is not None:
                evs.discard(ev)
                if not evs:
                    del self.waiters[user_id]
                    self.fanout.user_offline(user_id)

    def wake(self, user_ids: Iterable[int]) -> None:
        for uid in user_ids:
            for ev in self.waiters.get(uid, ()):
                ev.set()
