"""Cross-process delivery over Redis pub/sub: each process listens on its own inbox and
lists itself in a registry under the users connected to it; a frame is published to the
inboxes of the processes that hold a recipient, one message per process (never a
firehose to every process, never one message per user). A process that knows it is the
only live node skips publishing altogether. A control channel carries cache
invalidations (members, revoked tokens) and node joins.

This module decides what to deliver when; the channels, the envelope, the registry and
the listening connections are ``storage/redis/pubsub.py``'s."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from im_server import metrics
from im_server.context import Context
from im_server.errors import is_store_error
from im_server.gateway.hub import Hub
from im_server.protocol.close_codes import CloseCode
from im_server.storage.redis import pubsub
from im_server.storage.redis.store import RedisStore

log = logging.getLogger("im_server.fanout")
PRESENCE_S = 1.0  # how often this node says it is alive (``beat``)
NODE_TTL_MS = 5000  # a node that missed this long of beats is gone
PUBLISH_BATCH = 2000  # recipients per registry read and publish round trip
# Frames waiting to be published to other processes, counted in recipients: past this
# (Redis slower than the sends for long), the oldest are shed and counted; their
# recipients miss a push, never a message, and their devices' sync fills the gap (a seq
# past the one they hold, or the next state change, asks for it).
OUTBOX_MAX_RECIPIENTS = 200_000
CLOSE_UNAUTHORIZED = CloseCode.UNAUTHORIZED


class Fanout:
    def __init__(self, ctx: Context, hub: Hub, redis: RedisStore) -> None:
        self.ctx = ctx
        self.hub = hub
        self.redis = redis
        self.node = ctx.settings.node_name
        self.others = False  # another live node exists: publish
        self.live: set[str] = {self.node}  # the live nodes, as of the last beat
        self._announced = False
        self._outbox: collections.deque[pubsub.ForUsers] = collections.deque()
        self._queued = 0  # recipients in the outbox
        self._control: list[pubsub.Outgoing] = []
        self._wake = asyncio.Event()
        self._subscriber = pubsub.Subscriber(redis, self.node, self._on_message)
        self._tasks: list[asyncio.Task[Any]] = []

    # ---- EventSink ---------------------------------------------------------------------

    def push(
        self, user_ids: list[int] | tuple[int, ...], text: str, exclude_conn: int | None = None
    ) -> None:
        self.hub.deliver(user_ids, text, exclude_conn)
        if self.others:
            self._outbox.append((tuple(user_ids), text))
            self._queued += len(user_ids)
            if self._queued > OUTBOX_MAX_RECIPIENTS:
                self._shed()
            self._wake.set()

    async def claim_socket(self, user_id: int) -> bool:
        """One more socket of the user, unless the user holds the cap of sockets on every
        live node together (``max_connections_per_user`` for the user as a whole). A
        Redis that cannot answer lets the socket in (each process still caps its own)."""
        try:
            return await self.redis.claim_socket(
                user_id, self.node, self.live, self.ctx.settings.max_connections_per_user
            )
        except Exception as e:
            if not is_store_error(e):
                raise
            log.debug("socket count of user %d not kept: %r", user_id, e)
            return True

    def release_socket(self, user_id: int) -> None:
        self.ctx.spawn(self._release(user_id), name="socket-release")

    async def _release(self, user_id: int) -> None:
        try:
            await self.redis.release_socket(user_id, self.node)
        except Exception as e:
            if not is_store_error(e):
                raise
            log.debug("socket release of user %d not kept: %r", user_id, e)

    def _shed(self) -> None:
        """Drop the oldest frames until the outbox is back under its bound."""
        shed = 0
        while self._queued > OUTBOX_MAX_RECIPIENTS and len(self._outbox) > 1:
            user_ids, _ = self._outbox.popleft()
            self._queued -= len(user_ids)
            shed += len(user_ids)
        metrics.FANOUT_SHED.inc(shed)

    def invalidate(self, kind: str, key: str) -> None:
        self._control.append(pubsub.control(self.node, kind, key))
        self._wake.set()
        self._apply_control(kind, key)

    # ---- subscriptions -------------------------------------------------------------------

    async def subscribe_user(self, user_id: int) -> None:
        """List this process in the user's registry entry, so that frames for the user
        come here; bounded so a slow Redis cannot hold up a login (the listener writes
        every entry again when it reconnects, and every few seconds)."""
        try:
            await asyncio.wait_for(self._subscriber.add_user(user_id), 1.0)
        except TimeoutError:
            log.warning("registering user %d took over a second", user_id)

    def user_offline(self, user_id: int) -> None:
        self.ctx.spawn(self._subscriber.remove_user(user_id, self._still_here))

    def _still_here(self, user_id: int) -> bool:
        """The user came back meanwhile, or is long-polling: keep the subscription."""
        return bool(self.hub.user_connections(user_id)) or self.ctx.long_polls.has(user_id)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._subscriber.run(), name="fanout-listen"),
            asyncio.create_task(self._publisher(), name="fanout-publish"),
        ]

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.redis.leave(self.node), 1.0)
        except Exception as e:  # noqa: BLE001 - the entry expires by itself (NODE_TTL_MS)
            log.debug("leaving the node list failed: %r", e)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def beat(self) -> None:
        """The node-presence job (every PRESENCE_S): list this node as alive, learn
        whether other nodes are (then frames are published), and announce this node
        once, so the others start publishing to it."""
        try:
            nodes = await self.redis.heartbeat(self.node, NODE_TTL_MS)
            self.others = any(n != self.node for n in nodes)
            self.live = set(nodes)
        except BaseException:
            self.others = True  # Redis down: keep publishing to be safe
            raise
        finally:
            # with other processes serving, per-user limits count in Redis
            if self.ctx.rate.shared is not None:
                self.ctx.rate.shared.active = self.others
        if not self._announced:
            self.invalidate("node", self.node)
            self._announced = True

    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox or self._control:
                ctl, self._control = self._control, []
                batch = self._take_batch()
                try:
                    await pubsub.publish(self.redis, ctl)
                    await pubsub.send_to_users(self.redis, self.node, batch)
                except Exception as e:  # noqa: BLE001 - pushes are best effort; sync catches up
                    log.warning("publish of %d frames failed: %r", len(batch), e)
                    await asyncio.sleep(0.5)

    def _take_batch(self) -> list[pubsub.ForUsers]:
        """The oldest frames, up to PUBLISH_BATCH recipients (at least one frame)."""
        batch: list[pubsub.ForUsers] = []
        users = 0
        while self._outbox and users < PUBLISH_BATCH:
            item = self._outbox.popleft()
            batch.append(item)
            users += len(item[0])
        self._queued -= users
        return batch

    # ---- from other nodes ----------------------------------------------------------------

    def _on_message(self, msg: pubsub.Message) -> None:
        match msg:
            case pubsub.UserFrame(user_ids=user_ids, text=text):
                self.hub.deliver(user_ids, text)
            case pubsub.SyncWake(user_ids=user_ids):
                self.ctx.long_polls.wake(user_ids)
            case pubsub.Control(kind=kind, key=key):
                self._apply_control(kind, key)

    def _apply_control(self, kind: str, key: str) -> None:
        if kind == "members":
            self.ctx.members_cache.drop(key)
        elif kind == "token":
            h = bytes.fromhex(key)
            self.ctx.auth_cache.drop(h)
            self.hub.close_where(lambda c: c.token_hash == h, CLOSE_UNAUTHORIZED, "token revoked")
        elif kind == "user_tokens":
            # every token of the user issued before now: the user's sockets all close
            uid = int(key)
            self.ctx.auth_cache.drop_where(lambda s: s.user_id == uid)
            self.hub.close_where(lambda c: c.user_id == uid, CLOSE_UNAUTHORIZED, "tokens revoked")
        elif kind == "node":
            if key != self.node:
                self.others = True
