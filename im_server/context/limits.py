"""Per-user rate limits (token buckets) on sends, read reports, typing, member changes
and searches, for the user as a whole.

A bucket in this process's memory answers first: it sees only the requests that reach
this process, so when it refuses, the user is over the limit anyway. While this process
is alone (no other gateway process beats in Redis), that is the whole check, without a
store round trip. Once other processes serve (``--workers N``, several hosts), a user's
requests may reach several of them, so each accepted request also spends a token of the
user's bucket in Redis (``storage/redis/rate_ops.py``), shared by all: the limit holds
for the user, not per process. Why in leases: a process takes the user's tokens a few at
a time (a tenth of the rate, at least one) and spends them itself, so a user sending
steadily costs one round trip per lease, not one per message, and a send with a token
in hand keeps the fast path. Leased tokens count as spent in Redis, so the user never
gets more than the limit; tokens leased by a process the user left only make it
stricter for a moment. The leases of a moment share one script call (a
:class:`Coalescer`); a Redis that cannot answer lets the request through (counted in
``im_rate_shared_failures_total``) rather than refuse every user."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from im_server import metrics
from im_server.config import Settings
from im_server.context.batching import Coalescer
from im_server.errors import ImError, is_store_error
from im_server.storage.redis.rate_ops import RateAsk

log = logging.getLogger("im_server.limits")
_REFILLS: set[asyncio.Task[None]] = set()


class SharedRates:
    """The shared buckets' client: ``active`` while other processes serve (set by the
    gateway's node beat)."""

    def __init__(self, take: Callable[[list[RateAsk]], Awaitable[list[int]]]) -> None:
        self.active = False
        self._batcher: Coalescer[RateAsk, int] = Coalescer(take, 512)

    async def take(self, kind: str, user_id: int, rate: float, burst: float, n: int) -> int:
        """Up to ``n`` tokens of the user's shared bucket: how many were granted."""
        try:
            return await self._batcher.submit((kind, user_id, rate, burst, n))
        except Exception as e:
            if not is_store_error(e):
                raise
            metrics.RATE_SHARED_FAILURES.inc()
            log.debug("shared rate check failed: %r", e)
            return n


class Buckets:
    """rate tokens per second, up to burst; rate <= 0 disables the limit."""

    __slots__ = (
        "rate",
        "burst",
        "_state",
        "kind",
        "shared",
        "_leased",
        "lease_size",
        "_refilling",
    )

    def __init__(
        self, rate: float, burst: float, kind: str = "", shared: SharedRates | None = None
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._state: dict[int, tuple[float, float]] = {}
        self.kind = kind
        self.shared = shared
        self._leased: dict[int, int] = {}  # user -> shared tokens this process holds
        self.lease_size = max(1, int(min(self.burst, self.rate) / 10))
        self._refilling: set[int] = set()  # users whose next lease is on its way

    @property
    def shared_active(self) -> bool:
        """Whether a request also needs a token of the shared bucket."""
        return self.shared is not None and self.shared.active and self.rate > 0

    def needs_round_trip(self, user_id: int) -> bool:
        """Whether the user's next request waits for a lease of shared tokens."""
        return self.shared_active and self._leased.get(user_id, 0) <= 0

    def spend_leased(self, user_id: int) -> bool:
        """Spend a shared token this process holds for the user, if it holds one. Once
        the lease runs low the next one is asked for in the background, so a user who
        sends steadily finds a token in hand (a send that must wait for a lease waits
        for its socket's previous sends too, and so do the sends behind it)."""
        n = self._leased.get(user_id, 0)
        if n <= 0:
            return False
        if n == 1:
            del self._leased[user_id]
        else:
            self._leased[user_id] = n - 1
        if n - 1 <= self.lease_size // 2 and self.lease_size > 1:
            self._refill(user_id)
        return True

    def _hold(self, user_id: int, tokens: int) -> None:
        """Keep ``tokens`` more of the user's shared tokens in this process."""
        if tokens <= 0:
            return
        if len(self._leased) > 200_000:
            self._leased.clear()
        self._leased[user_id] = self._leased.get(user_id, 0) + tokens

    def prefetch(self, user_id: int) -> None:
        """Ask for the user's lease ahead of the first request (a socket just opened), so
        that the first send finds a token in hand."""
        if self.shared_active and self._leased.get(user_id, 0) <= 0:
            self._refill(user_id)

    def _refill(self, user_id: int) -> None:
        if user_id in self._refilling or self.shared is None:
            return
        self._refilling.add(user_id)
        shared = self.shared

        async def refill() -> None:
            try:
                self._hold(
                    user_id,
                    await shared.take(self.kind, user_id, self.rate, self.burst, self.lease_size),
                )
            finally:
                self._refilling.discard(user_id)

        task = asyncio.get_running_loop().create_task(refill(), name="rate-lease")
        _REFILLS.add(task)  # (the loop keeps only a weak reference)
        task.add_done_callback(_REFILLS.discard)

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
        """The shared bucket, while other processes serve (the second half of
        :meth:`hold`): a token of this process's lease, or a new lease."""
        if self.shared is None or not self.shared_active or self.spend_leased(user_id):
            return
        granted = await self.shared.take(self.kind, user_id, self.rate, self.burst, self.lease_size)
        if granted <= 0:
            raise ImError("rate_limited", f"too many {what}; slow down")
        self._hold(user_id, granted - 1)  # one is spent now

    async def hold(self, user_id: int, what: str) -> None:
        """The limit for the user as a whole: ``rate_limited`` when over it."""
        self.check(user_id, what)
        await self.check_shared(user_id, what)


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The per-user limits, one bucket set per kind of request, and the server API's
    per key."""

    send: Buckets
    read: Buckets
    typing: Buckets
    members: Buckets
    search: Buckets
    server_api: Buckets
    shared: SharedRates | None = None

    @classmethod
    def from_settings(cls, s: Settings, shared: SharedRates | None = None) -> RateLimits:
        return cls(
            send=Buckets(s.rate_send_per_s, s.rate_send_burst, "send", shared),
            read=Buckets(s.rate_read_per_s, s.rate_read_burst, "read", shared),
            typing=Buckets(s.rate_typing_per_s, s.rate_typing_burst, "typing", shared),
            members=Buckets(s.rate_members_per_s, s.rate_members_burst, "members", shared),
            search=Buckets(s.rate_search_per_s, s.rate_search_burst, "search", shared),
            server_api=Buckets(
                s.rate_server_api_per_s, s.rate_server_api_burst, "server_api", shared
            ),
            shared=shared,
        )
