"""Counted windows against abuse that a per-process token bucket cannot stop: each is a
counter per key in Redis (``attempt_take.lua``, the failed-login counters' script),
shared by every process, that allows ``max`` within ``window`` seconds of the first
count and answers ``rate_limited`` after, until the window passes.

- Username lookups and profiles of strangers (``GET /v1/users/lookup``,
  ``GET /v1/users/{id}``): per caller and per client address, so nobody walks the user
  base (``IM_LOOKUP_*``). Every lookup counts, found or not: a hit tells as much as a miss.
- Account creation (``POST /v1/users``): per client address (``IM_REGISTER_ADDR_*``);
  each registration costs a password hash, and accounts are what spam is sent from.
- Friend requests (``POST /v1/friends/requests``): per user (``IM_FRIEND_REQUEST_*``).

The counters are taken in turn and a refused attempt gives back what it counted, as for
logins. When Redis cannot be reached the attempt goes on uncounted (logged and counted in
``im_quota_unavailable_total{what}``): an outage must not stop people from signing up or
finding each other."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError
from im_server.services.login_throttle import address_of
from im_server.storage.redis import keys

log = logging.getLogger("im_server.quotas")

_STORE_ERRORS = (RedisError, OSError, TimeoutError)


async def _take(
    ctx: Context, what: str, limits: list[tuple[str, int]], window_s: int, refusal: str
) -> None:
    limits = [(key, most) for key, most in limits if most > 0]
    if not limits:
        return
    try:
        taken = await ctx.redis.take_attempts(limits, window_s)
        if all(taken):
            return
        counted = [key for (key, _), ok in zip(limits, taken, strict=True) if ok]
        if counted:
            await ctx.redis.settle_attempts(counted, [])
    except _STORE_ERRORS as e:
        metrics.QUOTA_UNAVAILABLE.labels(what).inc()
        log.warning("%s quota unavailable, not counted: %r", what, e)
        return
    raise ImError("rate_limited", refusal)


async def lookup(ctx: Context, caller: int, host: str | None) -> None:
    """Count one lookup for the caller and its address, or refuse it (``rate_limited``)."""
    s = ctx.settings
    limits = [(keys.lookups_user(caller), s.lookup_user_max)]
    addr = address_of(host)
    if addr is not None:
        limits.append((keys.lookups_addr(addr), s.lookup_addr_max))
    await _take(
        ctx, "lookup", limits, s.lookup_window_seconds, "too many user lookups, try again later"
    )


async def registration(ctx: Context, host: str | None) -> None:
    """Count one account creation from this address, or refuse it."""
    s = ctx.settings
    addr = address_of(host)
    if addr is None:
        return
    await _take(
        ctx,
        "registration",
        [(keys.registrations_addr(addr), s.register_addr_max)],
        s.register_window_seconds,
        "too many accounts created from this address, try again later",
    )


async def friend_request(ctx: Context, user_id: int) -> None:
    """Count one friend request of this user, or refuse it."""
    s = ctx.settings
    await _take(
        ctx,
        "friend_request",
        [(keys.friend_requests_user(user_id), s.friend_request_user_max)],
        s.friend_request_window_seconds,
        "too many friend requests, try again later",
    )
