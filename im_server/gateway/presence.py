"""This process's side of presence: the users one of whose devices got its first
connection here or lost its last one are marked dirty by the WebSocket endpoint, and one
task records them in Redis (``services.presence.do_record``) in batches, each with the
hub's devices of the user at that moment, so a quick open/close pair can never be
recorded out of order."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from im_server.context import Context
from im_server.errors import is_store_error
from im_server.gateway.hub import Hub
from im_server.services import presence

log = logging.getLogger("im_server.presence")
BATCH = 500
RETRY_S = 0.5


class PresenceTracker:
    def __init__(self, ctx: Context, hub: Hub) -> None:
        self.ctx = ctx
        self.hub = hub
        self.node = ctx.settings.node_name
        self._dirty: dict[int, None] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[Any] | None = None

    def touch(self, user_id: int) -> None:
        """A device of the user got its first connection here, or lost its last one."""
        self._dirty[user_id] = None
        self._idle.clear()
        self._wake.set()

    async def start(self) -> None:
        """Take over what an earlier process of the same node name left behind (its
        users go offline), then start recording."""
        try:
            await asyncio.wait_for(self._take_over(), 5.0)
        except Exception as e:  # noqa: BLE001 - the node's beat keeps them; logged
            log.warning("taking over this node's earlier presence entries failed: %r", e)
        self._task = asyncio.create_task(self._run(), name="presence-record")

    async def _take_over(self) -> None:
        await self.ctx.redis.presence_expire(self.node)
        while await self.ctx.redis.presence_listed(self.node):
            await presence.do_sweep(self.ctx)

    async def stop(self, timeout: float = 2.0) -> None:
        """Record what is left (after the sockets closed: everyone gone), then mark the
        node dead so a sweep (here or on another node) takes any user left offline."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            await asyncio.wait_for(self.ctx.redis.presence_expire(self.node), 1.0)
            await asyncio.wait_for(presence.do_sweep(self.ctx), 1.0)
        except Exception as e:  # noqa: BLE001 - the sweep of another node takes over
            log.warning("presence shutdown incomplete: %r", e)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def beat(self) -> None:
        """The presence-beat job: keep this node's entries alive; when a sweep had
        taken the node for dead (a long stall), record all its users again."""
        if await presence.do_beat(self.ctx, self.node):
            for user_id in list(self.hub.by_user):
                self.touch(user_id)

    async def sweep(self) -> None:
        """The presence-sweep job."""
        await presence.do_sweep(self.ctx)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                users = list(self._dirty)[:BATCH]
                for u in users:
                    del self._dirty[u]
                states = [(u, self.hub.user_devices(u)) for u in users]
                try:
                    await presence.do_record(self.ctx, self.node, states)
                except Exception as e:
                    if is_store_error(e):
                        log.warning("recording presence failed: %r", e)
                    else:
                        log.exception("recording presence failed")
                    for u in users:
                        self._dirty.setdefault(u, None)
                    await asyncio.sleep(RETRY_S)
            self._idle.set()
