"""Failed-login throttling, per username and per client address, shared by every process
through Redis.

An attempt is counted *before* the password is checked, in one atomic step with the
check of the limit (``attempt_take.lua``): parallel attempts cannot all slip past the
check while the first ones are still hashing. A successful check gives the address's
count back and clears the username's; a failure keeps both. Once a limit is reached the
answer is ``rate_limited`` without spending argon2 on it, until the counter's window
(``IM_LOGIN_FAIL_WINDOW_SECONDS``, from the first failure) passes. Unknown usernames are
counted like known ones, so the answers tell nothing about which exist.

When Redis cannot be reached, logins go on unthrottled (logged and counted in
``im_login_throttle_unavailable_total``): an outage must not lock everyone out."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError
from im_server.storage.redis import keys

log = logging.getLogger("im_server.logins")

_STORE_ERRORS = (RedisError, OSError, TimeoutError)


@dataclass(slots=True)
class Attempt:
    """The counters one attempt was counted on."""

    user_key: str | None = None
    addr_key: str | None = None
    counted: list[str] = field(default_factory=list)


def address_of(host: str | None) -> str | None:
    """The address a client is counted under: an IPv4 address as it is, an IPv6 one by
    its /64 (one subscriber usually holds a whole /64), None when unknown."""
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _user_counter(username_key: str) -> str:
    return keys.login_fails_user(hashlib.blake2b(username_key.encode(), digest_size=16).hexdigest())


async def begin(ctx: Context, username_key: str | None, host: str | None) -> Attempt:
    """Count an attempt for the username and the address, or refuse it (``rate_limited``)
    when either has reached its limit. A limit <= 0 is off."""
    s = ctx.settings
    attempt = Attempt()
    limits: list[tuple[str, int]] = []
    if username_key is not None and s.login_fail_user_max > 0:
        attempt.user_key = _user_counter(username_key)
        limits.append((attempt.user_key, s.login_fail_user_max))
    addr = address_of(host)
    if addr is not None and s.login_fail_addr_max > 0:
        attempt.addr_key = keys.login_fails_addr(addr)
        limits.append((attempt.addr_key, s.login_fail_addr_max))
    if not limits:
        return attempt
    try:
        taken = await ctx.redis.take_attempts(limits, s.login_fail_window_seconds)
    except _STORE_ERRORS as e:
        metrics.LOGIN_THROTTLE_UNAVAILABLE.inc()
        log.warning("login throttle unavailable, attempt not counted: %r", e)
        return attempt
    attempt.counted = [key for (key, _), ok in zip(limits, taken, strict=True) if ok]
    if len(attempt.counted) < len(limits):
        await give_back(ctx, attempt)
        metrics.LOGINS.labels("throttled").inc()
        raise ImError("rate_limited", "too many failed logins, try again later")
    return attempt


async def give_back(ctx: Context, attempt: Attempt) -> None:
    """The attempt was no failure after all (the check could not run): uncount it."""
    await _settle(ctx, give=attempt.counted, clear=[])
    attempt.counted = []


async def succeeded(ctx: Context, attempt: Attempt) -> None:
    """The password was right: the address's attempt is given back and the username's
    failures are forgotten."""
    give = [k for k in attempt.counted if k != attempt.user_key]
    clear = [attempt.user_key] if attempt.user_key is not None else []
    await _settle(ctx, give=give, clear=clear)
    attempt.counted = []


async def _settle(ctx: Context, give: list[str], clear: list[str]) -> None:
    if not give and not clear:
        return
    try:
        await ctx.redis.settle_attempts(give, clear)
    except _STORE_ERRORS as e:
        metrics.LOGIN_THROTTLE_UNAVAILABLE.inc()
        log.warning("login throttle unavailable, counters not settled: %r", e)
