"""What every service call needs: settings, the two stores, caches, and where events go.

Built once in the app's lifespan (or by ``im-server persister``) and passed explicitly:
services take it as their first argument instead of reaching for globals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.config import Settings
from im_server.storage.redis.store import RedisStore


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


class TTLCache:
    """A small dict with per-entry expiry; invalidated explicitly across processes."""

    def __init__(self, ttl: float, max_entries: int = 100_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._d: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any | None:
        hit = self._d.get(key)
        if hit is None:
            return None
        if hit[0] < time.monotonic():
            self._d.pop(key, None)
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._d) >= self.max_entries:
            self._d.clear()
        self._d[key] = (time.monotonic() + self.ttl, value)

    def drop(self, key: Any) -> None:
        self._d.pop(key, None)


@dataclass
class Context:
    settings: Settings
    db: AsyncEngine
    redis: RedisStore
    events: EventSink = field(default_factory=NullSink)
    auth_cache: TTLCache = field(default_factory=lambda: TTLCache(30.0))
    members_cache: TTLCache = field(default_factory=lambda: TTLCache(60.0))
    send_batcher: Any = None
    redis_recovery_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    extra: dict[str, Any] = field(default_factory=dict)

    def spawn(self, coro: Awaitable[Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
