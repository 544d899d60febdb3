"""What every service call needs: settings, the two stores, caches, and where events go.

Built once in the app's lifespan (or by ``im-server persister``) and passed explicitly:
services take it as their first argument instead of reaching for globals. Every
component is a typed field; the ones that only a gateway process has (its live
connections, long polls, the receipt pusher, the cursor batcher) are reached through
the small protocols below, with null versions for a process that has none, so each
coupling between layers is visible to a reader, to grep and to mypy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.config import Settings
from im_server.context.app_tokens import AppTokens
from im_server.context.batching import Coalescer, KeyedCoalescer
from im_server.context.before_send import BeforeSendHook
from im_server.context.health import Health
from im_server.context.limits import RateLimits
from im_server.errors import unavailable
from im_server.storage.apikeys import ApiKeyRow
from im_server.storage.cursors import CursorResult
from im_server.storage.objects import ObjectStore
from im_server.storage.redis.replies import SendDuplicate, SendResult
from im_server.storage.redis.store import RedisStore, SendArgs

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class Session(NamedTuple):
    """Who a live token speaks for. ``expires_at`` (ms): the end of a minted session or
    of an app-signed token (None: a login's, idle expiry only); ``app_signed``: a JWT of
    the app's, which no session row stands for, issued at ``issued_at`` (ms)."""

    user_id: int
    device_id: str
    expires_at: int | None = None
    app_signed: bool = False
    issued_at: int | None = None


@dataclass
class SeqRefills:
    """This process's seq-block refills (``services/seqs.py``): the one in flight per
    conversation (callers share it) and the conversations being topped up in the
    background."""

    inflight: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    topping_up: set[str] = field(default_factory=set)


# waits until woken or until the timeout (seconds) has passed
Woken = Callable[[float], Awaitable[None]]
# (sender_id, client_msg_id) -> where PostgreSQL has that message, if anywhere
DedupeChecker = Coalescer[tuple[int, str], SendDuplicate | None]


class EventSink(Protocol):
    """Delivers a server frame (already JSON text) to every live device of some users."""

    def push(
        self, user_ids: list[int] | tuple[int, ...], text: str, exclude_conn: int | None = None
    ) -> None: ...

    def invalidate(self, kind: str, key: str) -> None: ...


class NullSink:
    def push(
        self, user_ids: list[int] | tuple[int, ...], text: str, exclude_conn: int | None = None
    ) -> None:
        return None

    def invalidate(self, kind: str, key: str) -> None:
        return None


class SyncWaker(Protocol):
    """The long polls (``GET /v1/sync?wait=``) waiting in this process."""

    def waiting(self, user_id: int) -> AbstractAsyncContextManager[Woken]:
        """Register a waiter for the user while the block runs; it yields the wait."""
        ...

    def wake(self, user_ids: Iterable[int]) -> None: ...

    def has(self, user_id: int) -> bool: ...

    def count(self, user_id: int) -> int:
        """How many long polls of the user wait here now."""
        ...

    def waiting_any(self) -> bool: ...


class NullWaker:
    """No long polls here (``im-server persister``): a wait is a plain sleep."""

    @contextlib.asynccontextmanager
    async def waiting(self, user_id: int) -> AsyncIterator[Woken]:
        yield asyncio.sleep

    def wake(self, user_ids: Iterable[int]) -> None:
        return None

    def has(self, user_id: int) -> bool:
        return False

    def count(self, user_id: int) -> int:
        return 0

    def waiting_any(self) -> bool:
        return False


class ReceiptSink(Protocol):
    """Told of group conversations whose read cursors moved (their receipts are due)."""

    def touch(self, conv_id: str) -> None: ...


class NullReceipts:
    def touch(self, conv_id: str) -> None:
        return None


class CursorSink(Protocol):
    """Takes read/delivered reports; the future resolves once the cursor is durable."""

    def submit(
        self, kind: str, conv_id: str, user_id: int, seq: int, origin: int | None
    ) -> asyncio.Future[CursorResult]: ...


class NullCursors:
    """No cursor batcher here: reports are refused."""

    def submit(
        self, kind: str, conv_id: str, user_id: int, seq: int, origin: int | None
    ) -> asyncio.Future[CursorResult]:
        raise unavailable("read reports are not taken by this process")


class TTLCache(Generic[K, V]):
    """A small dict with per-entry expiry; invalidated explicitly across processes."""

    def __init__(self, ttl: float, max_entries: int = 100_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._d: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        hit = self._d.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            self._d.pop(key, None)
            return None
        return hit[1]

    def put(self, key: K, value: V) -> None:
        if len(self._d) >= self.max_entries:
            self._d.clear()
        self._d[key] = (time.monotonic() + self.ttl, value)

    def drop(self, key: K) -> None:
        self._d.pop(key, None)

    def __contains__(self, key: K) -> bool:
        hit = self._d.get(key)
        return hit is not None and hit[0] >= time.monotonic()

    def drop_where(self, pred: Callable[[V], bool]) -> int:
        """Drop every entry whose value matches (a scan: for rare invalidations)."""
        gone = [k for k, (_, v) in self._d.items() if pred(v)]
        for k in gone:
            self._d.pop(k, None)
        return len(gone)


@dataclass
class Context:
    settings: Settings
    db: AsyncEngine
    redis: RedisStore
    # sends to one stream partition arriving together share one script call
    # (RedisStore.send_many); each partition has a queue of its own
    send_batcher: KeyedCoalescer[SendArgs, SendResult]
    # asked only while a Redis that lost its data may have forgotten recent sends
    dedupe_checker: DedupeChecker
    health: Health
    rate: RateLimits
    events: EventSink = field(default_factory=NullSink)
    long_polls: SyncWaker = field(default_factory=NullWaker)
    receipts: ReceiptSink = field(default_factory=NullReceipts)
    cursors: CursorSink = field(default_factory=NullCursors)
    auth_cache: TTLCache[bytes, Session] = field(default_factory=lambda: TTLCache(30.0))
    # the before-send hook's client (no URL: no hook)
    before_send: BeforeSendHook = field(default_factory=BeforeSendHook)
    # the keys of app-signed tokens (none configured: JWTs are not accepted)
    app_tokens: AppTokens = field(default_factory=AppTokens)
    # users' external ids (None: not an app user), for the before-send hook's calls
    external_ids: TTLCache[int, str | None] = field(default_factory=lambda: TTLCache(60.0))
    # checked API keys by the key's hash (a revocation drops the entry everywhere)
    api_key_cache: TTLCache[bytes, ApiKeyRow] = field(default_factory=lambda: TTLCache(30.0))
    members_cache: TTLCache[str, list[int]] = field(default_factory=lambda: TTLCache(60.0))
    seq_refills: SeqRefills = field(default_factory=SeqRefills)
    redis_recovery_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: set[asyncio.Task[object]] = field(default_factory=set)
    # set by this process's persister when it wrote push rows, so the pusher here starts
    # at once instead of at its next poll
    push_due: asyncio.Event = field(default_factory=asyncio.Event)
    # set when this process wrote webhook deliveries, so its deliverer starts at once
    webhooks_due: asyncio.Event = field(default_factory=asyncio.Event)
    # the S3-compatible store of uploads (presigned URLs, HEAD, thumbnails); None in a
    # process without one (``im-server persister``)
    object_store: ObjectStore | None = None
    bucket_ready: bool = False
    # set when a send queued a thumbnail, so this process's worker starts at once
    thumbnails_due: asyncio.Event = field(default_factory=asyncio.Event)
    _bulk: asyncio.Semaphore | None = None

    @property
    def bulk_writes(self) -> asyncio.Semaphore:
        """The gate of bulk writes (a member add or group creation naming many users):
        at most ``bulk_write_concurrency`` at once here, so a burst of them waits in the
        server instead of taking every database connection, where everything else would
        wait behind them."""
        if self._bulk is None:
            self._bulk = asyncio.Semaphore(max(1, self.settings.bulk_write_concurrency))
        return self._bulk

    @property
    def objects(self) -> ObjectStore:
        """The object store, or ``unavailable`` where this process has none."""
        if self.object_store is None:
            raise unavailable("uploads are not available on this server")
        return self.object_store

    def spawn(self, coro: Coroutine[object, None, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` in the background; the lifespan waits for these on shutdown."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
