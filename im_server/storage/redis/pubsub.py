"""Cross-process messages over Redis pub/sub: the channels, the envelope, the registry
that routes them, and a node's listening connections. Callers deal in typed messages;
how they look on the wire and which channel carries them is this module's business.

- Each gateway node listens on its own inbox (``keys.inbox``). A user's frames go to the
  inboxes of the nodes the registry lists for the user (``keys.user_nodes``: a zset
  node -> expiry per user, written by the node before a socket's handshake completes and
  refreshed while it holds the user), one message per node and publish round, carrying
  ``<origin node>\n<user ids, comma-separated>\n<payload>`` for one record, or
  ``<origin node>\n*\n<users>\n<payload>\n<users>\n<payload>…`` for several (up to
  ``RECORDS_PER_MESSAGE``): the payload is a server frame (JSON text) for those users'
  devices, or ``SYNC_WAKE`` to wake their long polls. The frame is spliced in as it is,
  never re-encoded; one with a newline of its own (compact JSON has none) travels alone
  in the one-record form. A node of an older release refuses the ``*`` form (its users
  line is not ids): during a rolling upgrade it misses those pushes, which sync catches
  up, and never shows a garbled frame. Batching matters with several workers: a
  one-to-one message whose receiver is on another worker used to cost one publish, one
  wake of the subscriber and one decode of its own.
- On a Cluster the inboxes use sharded pub/sub (SPUBLISH/SSUBSCRIBE): a message travels
  to the one shard of its channel's slot, where classic PUBLISH is re-broadcast to every
  node of the cluster. On a single Redis they are classic channels.
- The control channel (``keys.CONTROL``) carries ``{"o": origin, "k": kind, "v": key}``
  JSON: cache invalidations and node joins, for every node (classic pub/sub everywhere:
  every node must hear it, and it is rare).

A node drops its own messages (it handled them locally before publishing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson
from redis.asyncio.client import PubSub
from redis.exceptions import MovedError

from im_server.errors import is_store_error
from im_server.storage.redis import keys
from im_server.storage.redis.store import RedisStore

log = logging.getLogger("im_server.pubsub")
SYNC_WAKE = "\x00sync"  # no frame starts with a NUL: JSON text cannot
BATCHED = "*"  # the users line of a message that carries several records
RECORDS_PER_MESSAGE = 256  # records per inbox message: bounds its size and a decode
MAX_BACKOFF_S = 5.0
REGISTRY_TTL_MS = 60_000  # a dead node's entries lapse after this
REGISTRY_REFRESH_S = 20.0  # a live node writes its users again this often
REGISTRY_CHUNK = 1000  # users per pipeline when writing them all again
MAP_REFRESH_TIMEOUT_S = 2.0  # a slot map not learnt by then is asked for on the next try


@dataclass(frozen=True, slots=True)
class UserFrame:
    """A frame for the live devices of ``user_ids`` on this node."""

    user_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class SyncWake:
    """Wake the long polls of ``user_ids`` on this node."""

    user_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Control:
    """A notice for every node: ``kind`` (members, token, node) about ``key``."""

    kind: str
    key: str


Message: TypeAlias = UserFrame | SyncWake | Control
Outgoing: TypeAlias = tuple[str, str]  # (channel, data): encoded, ready for ``publish``
ForUsers: TypeAlias = tuple[Sequence[int], str]  # (user ids, payload: a frame or SYNC_WAKE)


class BadMessage(ValueError):
    """A pub/sub message that does not follow the envelope."""


def route(origin: str, items: Sequence[ForUsers], nodes: dict[int, list[str]]) -> list[Outgoing]:
    """The inbox messages that carry the items to the nodes listed for their users (in
    ``nodes``), the origin itself left out: per node, its records (the item's users held
    there, the payload) in order, several to a message."""
    out: list[Outgoing] = []
    records: dict[str, list[str]] = {}  # node -> users, payload, users, payload, ...
    for user_ids, payload in items:
        per_node: dict[str, list[int]] = {}
        for u in user_ids:
            for n in nodes.get(u, ()):
                if n != origin:
                    per_node.setdefault(n, []).append(u)
        for n, us in per_node.items():
            users = ",".join(map(str, us))
            if "\n" in payload:
                out.append((keys.inbox(n), origin + "\n" + users + "\n" + payload))
            else:
                records.setdefault(n, []).extend((users, payload))
    step = 2 * RECORDS_PER_MESSAGE
    for n, recs in records.items():
        for i in range(0, len(recs), step):
            chunk = recs[i : i + step]
            head = origin if len(chunk) == 2 else origin + "\n" + BATCHED
            out.append((keys.inbox(n), head + "\n" + "\n".join(chunk)))
    return out


def control(origin: str, kind: str, key: str) -> Outgoing:
    return keys.CONTROL, orjson.dumps({"o": origin, "k": kind, "v": key}).decode()


def _user_ids(text: str) -> tuple[int, ...] | None:
    parts = text.split(",")
    if not all(p.isdigit() and p.isascii() and len(p) <= 19 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _record(channel: str, users: str, payload: str) -> Message:
    user_ids = _user_ids(users)
    if user_ids is None:
        raise BadMessage(f"message with bad user ids on {channel}: {users!r:.200}")
    if payload == SYNC_WAKE:
        return SyncWake(user_ids)
    return UserFrame(user_ids, payload)


def decode(channel: str, data: str) -> tuple[str, list[Message]]:
    """(origin node, its messages) of a received message; BadMessage when it is not ours."""
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
        return origin, [Control(kind, key)]
    if not channel.startswith(keys.INBOX):
        raise BadMessage(f"message on an unknown channel {channel!r:.200}")
    origin, sep, rest = data.partition("\n")
    users, sep2, payload = rest.partition("\n")
    if not (sep and sep2):
        raise BadMessage(f"message without origin and users on {channel}: {data!r:.200}")
    if users != BATCHED:
        return origin, [_record(channel, users, payload)]
    parts = payload.split("\n")
    if len(parts) % 2:
        raise BadMessage(f"a batched message with an odd number of lines on {channel}")
    return origin, [_record(channel, parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]


async def send_to_users(redis: RedisStore, origin: str, items: Sequence[ForUsers]) -> int:
    """Carry each item to the other nodes holding its users: one registry read for all
    the users, then one publish per node (its records batched), in one round trip.
    Returns how many messages were published."""
    users = sorted({u for user_ids, _ in items for u in user_ids})
    if not users:
        return 0
    out = route(origin, items, await redis.nodes_of(users, origin))
    await publish(redis, out)
    return len(out)


async def publish(redis: RedisStore, items: Sequence[Outgoing]) -> None:
    """Publish all items in one round trip: on a single Redis one pipeline of PUBLISH;
    on a Cluster the inbox messages as one pipeline of SPUBLISH (sent to each slot's
    shard, the shards in parallel) and control messages with PUBLISH one by one, at the
    same time (the cluster client refuses PUBLISH in a pipeline; they are rare)."""
    if not items:
        return
    if not redis.cluster:
        pipe = redis.client.pipeline(transaction=False)
        for channel, data in items:
            pipe.publish(channel, data)
        await pipe.execute()
        return
    inbox = [(c, d) for c, d in items if c != keys.CONTROL]
    calls: list[Awaitable[Any]] = [
        redis.client.publish(c, d) for c, d in items if c == keys.CONTROL
    ]
    if inbox:
        pipe = redis.client.pipeline(transaction=False)
        for channel, data in inbox:
            pipe.spublish(channel, data)
        calls.append(pipe.execute())
    await asyncio.gather(*calls)


class Subscriber:
    """This node's listening connections (the control channel and its inbox) and its
    entries in the user registry. ``run`` listens until cancelled; when Redis goes away
    it reconnects with backoff and subscribes again; each time its inbox is subscribed,
    and every ``REGISTRY_REFRESH_S``, it writes all its users into the registry again
    (a Redis that lost them, a fail-over). Messages from other nodes go to
    ``on_message``.

    On a Cluster the inbox is listened to on the shard of its slot, over a connection of
    its own; when the slot moves (the shard says ``sunsubscribe``) or the shard fails
    over, the listener finds the new owner and subscribes there."""

    def __init__(self, redis: RedisStore, node: str, on_message: Callable[[Message], None]) -> None:
        self.redis = redis
        self.node = node
        self.inbox = keys.inbox(node)
        self.on_message = on_message
        self._users: set[int] = set()
        self._lock = asyncio.Lock()
        self._refresh = asyncio.Event()

    @property
    def users(self) -> frozenset[int]:
        return frozenset(self._users)

    async def add_user(self, user_id: int) -> None:
        """List this node in the user's registry entry (at once; if Redis cannot take it,
        the next refresh does)."""
        async with self._lock:
            self._users.add(user_id)
            try:
                await self.redis.register_users(self.node, [user_id], REGISTRY_TTL_MS)
            except Exception as e:  # noqa: BLE001 - the refresh writes it again
                log.debug("registering user %d failed: %r", user_id, e)
                self._refresh.set()

    async def remove_user(self, user_id: int, keep: Callable[[int], bool]) -> None:
        """Take this node out of the user's entry, unless ``keep(user_id)`` says otherwise
        (asked under the lock, so a registration racing this one is never undone)."""
        async with self._lock:
            if keep(user_id):
                return
            self._users.discard(user_id)
            try:
                await self.redis.unregister_user(self.node, user_id)
            except Exception as e:  # noqa: BLE001 - a stale entry only costs traffic, and lapses
                log.debug("unregistering user %d failed: %r", user_id, e)

    async def run(self) -> None:
        loops: list[Awaitable[None]] = [self._refresher()]
        if self.redis.cluster:
            loops += [
                self._loop("control", self._listen_control),
                self._loop("inbox", self._listen_inbox),
            ]
        else:
            loops.append(self._loop("pub/sub", self._listen_both))
        tasks = [asyncio.ensure_future(c) for c in loops]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(
        self, what: str, listen: Callable[[Callable[[], None]], Awaitable[None]]
    ) -> None:
        """Run ``listen`` again and again, with backoff between failures; ``listen`` calls
        the function it is given once subscribed, which starts the backoff over."""
        backoff = 0.1

        def subscribed() -> None:
            nonlocal backoff
            backoff = 0.1

        while True:
            try:
                await listen(subscribed)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis went away: reconnect with backoff
                if is_store_error(e) or isinstance(e, InboxMoved):
                    log.warning("%s listener lost Redis (%r), retrying in %.1f s", what, e, backoff)
                else:
                    log.exception("%s listener failed, retrying in %.1f s", what, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _listen_both(self, subscribed: Callable[[], None]) -> None:
        """A single Redis: the control channel and the inbox on one connection."""
        ps = await self.redis.pubsub()
        try:
            await ps.subscribe(keys.CONTROL, self.inbox)
            subscribed()
            self._refresh.set()
            await self._drain(ps)
        finally:
            await _close(ps)

    async def _listen_control(self, subscribed: Callable[[], None]) -> None:
        ps = await self.redis.pubsub()
        try:
            await ps.subscribe(keys.CONTROL)
            subscribed()
            await self._drain(ps)
        finally:
            await _close(ps)

    async def _listen_inbox(self, subscribed: Callable[[], None]) -> None:
        """A Cluster: the inbox on its shard. Subscribe confirmations are kept (not
        ignored) so that the shard's ``sunsubscribe`` on a slot move is seen."""
        client = await self.redis.node_client(self.inbox)
        ps = client.pubsub()
        try:
            try:
                await ps.ssubscribe(self.inbox)
            except MovedError as e:  # a map older than the move: learnt again below
                raise InboxMoved(f"{self.inbox} is served elsewhere ({e})") from e
            subscribed()
            self._refresh.set()
            await self._drain(ps)
        except Exception:  # moved or gone: learn the map before subscribing again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.redis.refresh_map(), MAP_REFRESH_TIMEOUT_S)
            raise
        finally:
            await _close(ps)

    async def _drain(self, ps: PubSub) -> None:
        while True:
            msg: dict[str, Any] | None = await ps.get_message(timeout=1.0)
            if msg is None:
                continue
            kind = msg["type"]
            if kind in ("message", "smessage"):
                self._dispatch(str(msg["channel"]), str(msg["data"]))
            elif kind == "sunsubscribe":
                raise InboxMoved(f"{msg['channel']} left its shard (its slot moved)")

    async def _refresher(self) -> None:
        """Write every user of this node into the registry again: when asked (a fresh
        subscription, a failed write) and every ``REGISTRY_REFRESH_S``."""
        while True:
            try:
                await asyncio.wait_for(self._refresh.wait(), REGISTRY_REFRESH_S)
            except TimeoutError:
                pass
            self._refresh.clear()
            users = sorted(self._users)
            try:
                for i in range(0, len(users), REGISTRY_CHUNK):
                    chunk = users[i : i + REGISTRY_CHUNK]
                    await self.redis.register_users(self.node, chunk, REGISTRY_TTL_MS)
            except Exception as e:  # noqa: BLE001 - tried again on the next round
                log.warning("refreshing %d registry entries failed: %r", len(users), e)
                await asyncio.sleep(1.0)
                self._refresh.set()

    def _dispatch(self, channel: str, data: str) -> None:
        try:
            origin, msgs = decode(channel, data)
        except BadMessage as e:
            log.warning("dropped a pub/sub message: %s", e)
            return
        if origin == self.node:
            return
        for msg in msgs:
            try:
                self.on_message(msg)
            except Exception:  # one bad message must not stop the listener
                log.exception("handling a pub/sub message failed")


class InboxMoved(Exception):
    """The inbox's slot left the shard it was subscribed on."""


async def _close(ps: PubSub) -> None:
    try:
        # through Any: redis-py's typing of aclose differs between its releases
        closing: Any = ps
        await closing.aclose()
    except Exception as e:  # noqa: BLE001 - closing a connection that is already gone
        log.debug("closing the pub/sub connection failed: %r", e)
