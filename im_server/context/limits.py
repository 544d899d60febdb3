"""Per-user rate limits (token buckets) on sends, read reports, typing, member changes
and searches. Kept in process memory: a user's connections usually land on one process, and
a check that costs a store round trip on every frame would cost more than the abuse it
stops. With N processes a user can reach at most N times the rate."""

from __future__ import annotations

import time
from dataclasses import dataclass

from im_server.config import Settings
from im_server.errors import ImError


class Buckets:
    """rate tokens per second, up to burst; rate <= 0 disables the limit."""

    __slots__ = ("rate", "burst", "_state")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._state: dict[int, tuple[float, float]] = {}

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
        if not self.take(user_id):
            raise ImError("rate_limited", f"too many {what}; slow down")


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The per-user limits of one process, one bucket set per kind of request."""

    send: Buckets
    read: Buckets
    typing: Buckets
    members: Buckets
    search: Buckets

    @classmethod
    def from_settings(cls, s: Settings) -> RateLimits:
        return cls(
            send=Buckets(s.rate_send_per_s, s.rate_send_burst),
            read=Buckets(s.rate_read_per_s, s.rate_read_burst),
            typing=Buckets(s.rate_typing_per_s, s.rate_typing_burst),
            members=Buckets(s.rate_members_per_s, s.rate_members_burst),
            search=Buckets(s.rate_search_per_s, s.rate_search_burst),
        )
