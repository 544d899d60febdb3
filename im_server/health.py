"""Store reachability for /readyz: each check bounded to one second."""

from __future__ import annotations

import asyncio

from im_server.context import Context
from im_server.storage import db


class Health:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def _pg(self) -> bool:
        try:
            await asyncio.wait_for(db.ping(self.ctx.db), 1.0)
            return True
        except Exception:  # noqa: BLE001
            return False

    async def _redis(self) -> bool:
        try:
            return await asyncio.wait_for(self.ctx.redis.ping(), 1.0)
        except Exception:  # noqa: BLE001
            return False

    async def check(self) -> dict[str, bool]:
        pg, rd = await asyncio.gather(self._pg(), self._redis())
        return {"postgres": pg, "redis": rd}
