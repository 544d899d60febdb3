"""The periodic re-check of the open WebSockets' tokens.

A revocation reaches other processes as a notice on the control channel, and a notice can
be lost (Redis restarting, a listener reconnecting). So every
``IM_TOKEN_RECHECK_SECONDS`` each process asks PostgreSQL, in one batched statement,
which of the distinct tokens behind its sockets are still live, and closes (4401) the
sockets of the others. The same statement marks the live ones as used: a socket that
stays open keeps its token from expiring idle."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from im_server import metrics
from im_server.context import Context
from im_server.gateway.fanout import CLOSE_UNAUTHORIZED
from im_server.gateway.hub import Conn, Hub
from im_server.services import accounts

log = logging.getLogger("im_server.recheck")


class TokenRecheck:
    def __init__(self, ctx: Context, hub: Hub) -> None:
        self.ctx = ctx
        self.hub = hub
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        if self.ctx.settings.token_recheck_seconds > 0:
            self._task = asyncio.create_task(self._run(), name="token-recheck")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        every = self.ctx.settings.token_recheck_seconds
        while True:
            # a little jitter, so the processes of a cluster do not ask all at once
            await asyncio.sleep(every * random.uniform(0.9, 1.1))
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the store is down: keep the sockets, try later
                metrics.TOKEN_RECHECKS.labels("failed").inc()
                log.warning("token re-check failed: %r", e)

    async def check_once(self) -> int:
        """Close the sockets whose token is no longer live; how many were closed."""
        conns = [c for c in self.hub.all() if not c.closing]
        n = await self._check_app_signed([c for c in conns if c.issued_at is not None])
        hashes = list({c.token_hash for c in conns if c.issued_at is None})
        if not hashes:
            return n
        live = await accounts.live_tokens(self.ctx, hashes)
        metrics.TOKEN_RECHECKS.labels("ok").inc()
        dead = set(hashes) - live
        if not dead:
            return n
        for h in dead:
            self.ctx.auth_cache.drop(h)
        n = self.hub.close_where(
            lambda c: c.token_hash in dead, CLOSE_UNAUTHORIZED, "token revoked"
        )
        metrics.TOKEN_RECHECK_CLOSED.inc(n)
        log.info("token re-check closed %d socket(s) of %d dead token(s)", n, len(dead))
        return n

    async def _check_app_signed(self, conns: list[Conn]) -> int:
        """App-signed tokens have no session row: their user's "revoke every token"
        time (or its deletion) is what ends them."""
        if not conns:
            return 0
        floors = await accounts.token_floors(self.ctx, list({c.user_id for c in conns}))

        def dead(c: Conn) -> bool:
            if c.user_id not in floors:
                return True  # deleted
            floor = floors[c.user_id]
            return floor is not None and (c.issued_at or 0) < floor

        gone = {id(c) for c in conns if dead(c)}
        if not gone:
            return 0
        n = self.hub.close_where(lambda c: id(c) in gone, CLOSE_UNAUTHORIZED, "token revoked")
        metrics.TOKEN_RECHECK_CLOSED.inc(n)
        return n
