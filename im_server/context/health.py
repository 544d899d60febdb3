"""Store reachability for /readyz: each check bounded to one second."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.storage import db
from im_server.storage.redis.store import RedisStore


class Health:
    def __init__(self, engine: AsyncEngine, redis: RedisStore) -> None:
        self.engine = engine
        self.redis = redis

    async def _pg(self) -> bool:
        try:
            await asyncio.wait_for(db.ping(self.engine), 1.0)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not ready"; /readyz says so
            return False

    async def _redis(self) -> bool:
        try:
            return await asyncio.wait_for(self.redis.ping(), 1.0)
        except Exception:  # noqa: BLE001 - any failure means "not ready"; /readyz says so
            return False

    async def check(self) -> dict[str, bool]:
        pg, rd = await asyncio.gather(self._pg(), self._redis())
        return {"postgres": pg, "redis": rd}
