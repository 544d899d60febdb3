"""Per-user rate limits (token buckets) on sends, read reports, typing, member changes
and searches, for the user as a whole.

A bucket in this process's memory answers first: it sees only the requests that reach
this process, so when it refuses, the user is over the limit anyway. While this process
is alone (no other gateway process beats in Redis), that is the whole check, without a
store round trip. Once other processes serve (``--workers N``, several hosts), a user's
requests may reach several of them, so each accepted request also takes a token from the
user's bucket in Redis (``storage/redis/rate_ops.py``), shared by all: the limit holds
for the user, not per process. Those checks of a moment share one script call
(a :class:`Coalescer`); a Redis that cannot answer lets the request through (counted in
``im_rate_shared_failures_total``) rather than refuse every user."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from im_server import metrics
from im_server.config import Settings
from im_server.context.batching import Coalescer
from im_server.errors import ImError, is_store_error

log = logging.getLogger("im_server.limits")
RateAsk = tuple[str, int, float, float]  # (kind, user_id, rate per s, burst)


class SharedRates:
    """The shared buckets' client: ``active`` while other processes serve (set by the
    gateway's node beat)."""

    def __init__(self, take: Callable[[list[RateAsk]], Awaitable[list[bool]]]) -> None:
        self.active = False
        self._batcher: Coalescer[RateAsk, bool] = Coalescer(take, 512)

    async def take(self, kind: str, user_id: int, rate: float, burst: float) -> bool:
        try:
            return await self._batcher.submit((kind, user_id, rate, burst))
        except Exception as e:
            if not is_store_error(e):
                raise
            metrics.RATE_SHARED_FAILURES.inc()
            log.debug("shared rate check failed: %r", e)
            return True


class Buckets:
    """rate tokens per second, up to burst; rate <= 0 disables the limit."""

    __slots__ = ("rate", "burst", "_state", "kind", "shared")

    def __init__(
        self, rate: float, burst: float, kind: str = "", shared: SharedRates | None = None
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._state: dict[int, tuple[float, float]] = {}
        self.kind = kind
        self.shared = shared

    @property
    def shared_active(self) -> bool:
        """Whether a request also needs a token of the shared bucket."""
        return self.shared is not None and self.shared.active and self.rate > 0

    def take(self, user_id: int, cost: float = 1.0) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic()
        tokens, last = self._state.get(user_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < cost:
            self._state[user_id] = (tokens, now)
            return False
        self._state[user_id] = (tokens - cost, now)
        if len(self._state) > 200_000:
            self._state.clear()
        return True

    def check(self, user_id: int, what: str) -> None:
        """This process's bucket only (the first half of :meth:`hold`)."""
        if not self.take(user_id):
            raise ImError("rate_limited", f"too many {what}; slow down")

    async def check_shared(self, user_id: int, what: str) -> None:
        """The shared bucket, while other processes serve (the second half of :meth:`hold`)."""
        if self.shared is not None and self.shared_active:
            if not await self.shared.take(self.kind, user_id, self.rate, self.burst):
                raise ImError("rate_limited", f"too many {what}; slow down")

    async def hold(self, user_id: int, what: str) -> None:
        """The limit for the user as a whole: ``rate_limited`` when over it."""
        self.check(user_id, what)
        await self.check_shared(user_id, what)


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The per-user limits, one bucket set per kind of request."""

    send: Buckets
    read: Buckets
    typing: Buckets
    members: Buckets
    search: Buckets
    shared: SharedRates | None = None

    @classmethod
    def from_settings(cls, s: Settings, shared: SharedRates | None = None) -> RateLimits:
        return cls(
            send=Buckets(s.rate_send_per_s, s.rate_send_burst, "send", shared),
            read=Buckets(s.rate_read_per_s, s.rate_read_burst, "read", shared),
            typing=Buckets(s.rate_typing_per_s, s.rate_typing_burst, "typing", shared),
            members=Buckets(s.rate_members_per_s, s.rate_members_burst, "members", shared),
            search=Buckets(s.rate_search_per_s, s.rate_search_burst, "search", shared),
            shared=shared,
        )
