"""Cross-process messages over Redis pub/sub: the channels, the envelope, and a node's
listening connection. Callers deal in typed messages; how they look on the wire and
which channel carries them is this module's business.

- A user's channel (``keys.user_channel``) carries ``<origin node>\\n<payload>``: the
  payload is a server frame (JSON text) for the user's devices, or ``SYNC_WAKE`` to wake
  the user's long polls. The frame is spliced in as it is, never re-encoded.
- The control channel (``keys.CONTROL``) carries ``{"o": origin, "k": kind, "v": key}``
  JSON: cache invalidations and node joins, for every node.

A node drops its own messages (it handled them locally before publishing)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import orjson
from redis.asyncio.client import PubSub

from im_server.errors import is_store_error
from im_server.storage.redis import keys
from im_server.storage.redis.store import RedisStore

log = logging.getLogger("im_server.pubsub")
SYNC_WAKE = "\x00sync"  # no frame starts with a NUL: JSON text cannot
MAX_BACKOFF_S = 5.0
CLUSTER_PUBLISH_CONCURRENCY = 32  # below the client's 64 connections per node


@dataclass(frozen=True, slots=True)
class UserFrame:
    """A frame for the live devices of ``user_id`` on this node."""

    user_id: int
    text: str


@dataclass(frozen=True, slots=True)
class SyncWake:
    """Wake the long polls of ``user_id`` on this node."""

    user_id: int


@dataclass(frozen=True, slots=True)
class Control:
    """A notice for every node: ``kind`` (members, token, node) about ``key``."""

    kind: str
    key: str


Message: TypeAlias = UserFrame | SyncWake | Control
Outgoing: TypeAlias = tuple[str, str]  # (channel, data): encoded, ready for ``publish``


class BadMessage(ValueError):
    """A pub/sub message that does not follow the envelope."""


def user_frames(origin: str, user_ids: Iterable[int], text: str) -> list[Outgoing]:
    """The frame ``text`` for each of the users, from node ``origin``."""
    data = origin + "\n" + text
    return [(keys.user_channel(u), data) for u in user_ids]


def sync_wakes(origin: str, user_ids: Iterable[int]) -> list[Outgoing]:
    data = origin + "\n" + SYNC_WAKE
    return [(keys.user_channel(u), data) for u in user_ids]


def control(origin: str, kind: str, key: str) -> Outgoing:
    return keys.CONTROL, orjson.dumps({"o": origin, "k": kind, "v": key}).decode()


def decode(channel: str, data: str) -> tuple[str, Message]:
    """(origin node, message) of a received message; BadMessage when it is not ours."""
    if channel == keys.CONTROL:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise BadMessage(f"control message is not JSON: {data!r:.200}") from e
        if not isinstance(msg, dict):
            raise BadMessage(f"control message is not an object: {data!r:.200}")
        origin, kind, key = msg.get("o"), msg.get("k"), msg.get("v")
        if not (isinstance(origin, str) and isinstance(kind, str) and isinstance(key, str)):
            raise BadMessage(f"control message needs text o, k, v: {data!r:.200}")
        return origin, Control(kind, key)
    user_id = keys.user_of_channel(channel)
    if user_id is None:
        raise BadMessage(f"message on an unknown channel {channel!r:.200}")
    origin, sep, payload = data.partition("\n")
    if not sep:
        raise BadMessage(f"message without an origin on {channel}: {data!r:.200}")
    if payload == SYNC_WAKE:
        return origin, SyncWake(user_id)
    return origin, UserFrame(user_id, payload)


async def publish(redis: RedisStore, items: Sequence[Outgoing]) -> None:
    """Publish all items, in one round trip (on a Cluster, whose client refuses PUBLISH
    in a pipeline, up to ``CLUSTER_PUBLISH_CONCURRENCY`` in flight at once)."""
    if not items:
        return
    if len(items) == 1:
        await redis.client.publish(*items[0])
        return
    if redis.cluster:
        for i in range(0, len(items), CLUSTER_PUBLISH_CONCURRENCY):
            chunk = items[i : i + CLUSTER_PUBLISH_CONCURRENCY]
            await asyncio.gather(*(redis.client.publish(c, d) for c, d in chunk))
        return
    pipe = redis.client.pipeline(transaction=False)
    for channel, data in items:
        pipe.publish(channel, data)
    await pipe.execute()


class Subscriber:
    """This node's listening connection: the control channel plus the channels of the
    users it holds. ``run`` listens until cancelled; when Redis goes away it reconnects
    with backoff and subscribes everything again, so subscriptions asked for meanwhile
    are not lost. Messages from other nodes go to ``on_message``."""

    def __init__(self, redis: RedisStore, node: str, on_message: Callable[[Message], None]) -> None:
        self.redis = redis
        self.node = node
        self.on_message = on_message
        self._channels: set[str] = set()
        self._pubsub: PubSub | None = None
        self._lock = asyncio.Lock()
        self._backoff = 0.1

    async def add_user(self, user_id: int) -> None:
        """Listen on the user's channel (at once when connected, else on reconnect)."""
        channel = keys.user_channel(user_id)
        async with self._lock:
            self._channels.add(channel)
            if self._pubsub is not None:
                try:
                    await self._pubsub.subscribe(channel)
                except Exception as e:  # noqa: BLE001 - the listener resubscribes on reconnect
                    log.debug("subscribe %s failed: %r", channel, e)

    async def remove_user(self, user_id: int, keep: Callable[[int], bool]) -> None:
        """Stop listening on the user's channel, unless ``keep(user_id)`` says otherwise
        (asked under the lock, so a subscribe racing this one is never undone)."""
        channel = keys.user_channel(user_id)
        async with self._lock:
            if keep(user_id):
                return
            self._channels.discard(channel)
            if self._pubsub is not None:
                try:
                    await self._pubsub.unsubscribe(channel)
                except Exception as e:  # noqa: BLE001 - a stale subscription only costs traffic
                    log.debug("unsubscribe %s failed: %r", channel, e)

    async def run(self) -> None:
        self._backoff = 0.1
        while True:
            ps = await self.redis.pubsub()
            try:
                await self._listen(ps)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis went away: reconnect with backoff
                if is_store_error(e):
                    log.warning(
                        "pub/sub listener lost Redis (%r), retrying in %.1f s", e, self._backoff
                    )
                else:
                    log.exception("pub/sub listener failed, retrying in %.1f s", self._backoff)
            finally:
                if self._pubsub is ps:
                    self._pubsub = None
                await _close(ps)
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    async def _listen(self, ps: PubSub) -> None:
        async with self._lock:
            await ps.subscribe(keys.CONTROL, *self._channels)
            self._pubsub = ps
        self._backoff = 0.1
        while True:
            msg = await ps.get_message(timeout=1.0)
            if msg is not None:
                self._dispatch(str(msg["channel"]), str(msg["data"]))

    def _dispatch(self, channel: str, data: str) -> None:
        try:
            origin, msg = decode(channel, data)
        except BadMessage as e:
            log.warning("dropped a pub/sub message: %s", e)
            return
        if origin == self.node:
            return
        try:
            self.on_message(msg)
        except Exception:  # one bad message must not stop the listener
            log.exception("handling a pub/sub message failed")


async def _close(ps: PubSub) -> None:
    try:
        await ps.aclose()  # type: ignore[no-untyped-call]
    except Exception as e:  # noqa: BLE001 - closing a connection that is already gone
        log.debug("closing the pub/sub connection failed: %r", e)
