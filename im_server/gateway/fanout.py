"""Cross-process delivery over Redis pub/sub, one channel per user: a process subscribes
to the channels of the users connected to it, so a message reaches only the processes
that hold a recipient (never a firehose to every process). A process that knows it is
the only live node skips publishing altogether. A control channel carries cache
invalidations (members, revoked tokens) and node joins."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from redis.asyncio.client import PubSub

from im_server import metrics
from im_server.context import Context
from im_server.gateway.hub import Hub
from im_server.protocol.close_codes import CloseCode
from im_server.services.notify import SYNC_WAKE
from im_server.storage.redis import keys
from im_server.storage.redis.store import RedisStore

log = logging.getLogger("im_server.fanout")
HEARTBEAT_S = 1.0
NODE_TTL_MS = 5000
CLOSE_UNAUTHORIZED = CloseCode.UNAUTHORIZED


class Fanout:
    def __init__(self, ctx: Context, hub: Hub, redis: RedisStore) -> None:
        self.ctx = ctx
        self.hub = hub
        self.redis = redis
        self.node = ctx.settings.node_name
        self.others = False  # another live node exists: publish
        self._outbox: list[tuple[str, str]] = []
        self._wake = asyncio.Event()
        self._subscribed: set[str] = set()
        self._pubsub: PubSub | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._stopping = False
        self._sub_lock = asyncio.Lock()

    # ---- EventSink ---------------------------------------------------------------------

    def push(
        self, user_ids: list[int] | tuple[int, ...], text: str, exclude_conn: int | None = None
    ) -> None:
        self.hub.deliver(user_ids, text, exclude_conn)
        if self.others:
            payload = self.node + "\n" + text
            self._outbox.extend((keys.user_channel(u), payload) for u in user_ids)
            self._wake.set()

    def invalidate(self, kind: str, key: str) -> None:
        self._outbox.append(
            (keys.CONTROL, orjson.dumps({"o": self.node, "k": kind, "v": key}).decode())
        )
        self._wake.set()
        self._apply_control(kind, key)

    # ---- subscriptions -------------------------------------------------------------------

    async def subscribe_user(self, user_id: int) -> None:
        """Subscribe to the user's channel; bounded so a slow Redis cannot hold up a login
        (the listener resubscribes everything when it reconnects)."""
        try:
            await asyncio.wait_for(self._subscribe(keys.user_channel(user_id)), 1.0)
        except TimeoutError:
            log.warning("subscribing user %d took over a second", user_id)

    def user_offline(self, user_id: int) -> None:
        self.ctx.spawn(self._unsubscribe(keys.user_channel(user_id)))

    async def _subscribe(self, channel: str) -> None:
        async with self._sub_lock:
            self._subscribed.add(channel)
            if self._pubsub is not None:
                try:
                    await self._pubsub.subscribe(channel)
                except Exception as e:  # noqa: BLE001 - the listener resubscribes on reconnect
                    log.debug("subscribe %s failed: %r", channel, e)

    async def _unsubscribe(self, channel: str) -> None:
        async with self._sub_lock:
            uid = int(channel.rsplit(":", 1)[1])
            polls = self.ctx.extra.get("longpolls")
            if self.hub.user_connections(uid) or (polls is not None and polls.has(uid)):
                return  # the user came back meanwhile, or is long-polling
            self._subscribed.discard(channel)
            if self._pubsub is not None:
                try:
                    await self._pubsub.unsubscribe(channel)
                except Exception as e:  # noqa: BLE001
                    log.debug("unsubscribe %s failed: %r", channel, e)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="fanout-listen"),
            asyncio.create_task(self._publisher(), name="fanout-publish"),
            asyncio.create_task(self._heartbeat(), name="fanout-heartbeat"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        try:
            await asyncio.wait_for(self.redis.leave(self.node), 1.0)
        except Exception:  # noqa: BLE001
            pass
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pubsub is not None:
            try:
                await self._pubsub.aclose()
            except Exception:  # noqa: BLE001
                pass

    async def _heartbeat(self) -> None:
        announced = False
        while not self._stopping:
            try:
                nodes = await self.redis.heartbeat(self.node, NODE_TTL_MS)
                self.others = any(n != self.node for n in nodes)
                if not announced:
                    self.invalidate("node", self.node)
                    announced = True
                if self.redis.run_id_changed.is_set():
                    self.redis.run_id_changed.clear()
                    from im_server.services import recovery

                    await recovery.check_redis_epoch(self.ctx)
                else:
                    await self.redis.refresh_cold_until()
                if int(time.monotonic()) % 30 == 0:
                    await self.redis.expire_long_polls()
                metrics.STREAM_DEPTH.set(
                    await self.redis.stream_depth(self.ctx.settings.stream_partitions)
                )
            except Exception as e:  # noqa: BLE001 - Redis down: keep publishing to be safe
                self.others = True
                log.debug("heartbeat failed: %r", e)
            await asyncio.sleep(HEARTBEAT_S)

    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                batch, self._outbox = self._outbox[:2000], self._outbox[2000:]
                try:
                    await self.redis.publish_many(batch)
                except Exception as e:  # noqa: BLE001 - pushes are best effort; sync catches up
                    log.warning("publish of %d frames failed: %r", len(batch), e)
                    await asyncio.sleep(0.5)

    async def _listen(self) -> None:
        backoff = 0.1
        while not self._stopping:
            try:
                ps = self.redis.client.pubsub(ignore_subscribe_messages=True)
                async with self._sub_lock:
                    await ps.subscribe(keys.CONTROL, *self._subscribed)
                    self._pubsub = ps
                backoff = 0.1
                while True:
                    msg = await ps.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    self._on_message(str(msg["channel"]), str(msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis went away: reconnect with backoff
                log.warning("pub/sub listener lost Redis (%r), retrying in %.1f s", e, backoff)
                self._pubsub = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _on_message(self, channel: str, data: str) -> None:
        if channel == keys.CONTROL:
            msg = orjson.loads(data)
            if msg.get("o") != self.node:
                self._apply_control(msg["k"], msg["v"])
            return
        origin, _, text = data.partition("\n")
        if origin == self.node:
            return
        uid = int(channel.rsplit(":", 1)[1])
        if text == SYNC_WAKE:
            polls = self.ctx.extra.get("longpolls")
            if polls is not None:
                polls.wake((uid,))
            return
        self.hub.deliver((uid,), text)

    def _apply_control(self, kind: str, key: str) -> None:
        if kind == "members":
            self.ctx.members_cache.drop(key)
        elif kind == "token":
            h = bytes.fromhex(key)
            self.ctx.auth_cache.drop(h)
            self.hub.close_where(lambda c: c.token_hash == h, CLOSE_UNAUTHORIZED, "token revoked")
        elif kind == "node":
            if key != self.node:
                self.others = True
