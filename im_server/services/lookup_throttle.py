"""Username lookups (``GET /v1/users/lookup``) are counted per caller and per client
address in Redis, with the login counters' script (``attempt_take.lua``), so that nobody
can walk the user base by trying names: past ``IM_LOOKUP_USER_MAX`` lookups of one user,
or ``IM_LOOKUP_ADDR_MAX`` from one address, within ``IM_LOOKUP_WINDOW_SECONDS`` of the
first, the answer is ``rate_limited`` until the window passes.

Every lookup counts, found or not: a hit tells as much as a miss. The counters are taken
in turn (the caller's, then the address's) and a refused lookup gives back what it
counted, as for logins. When Redis cannot be reached, lookups go on uncounted (logged
and counted in ``im_lookup_throttle_unavailable_total``): an outage must not stop people
from finding each other."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError
from im_server.services.login_throttle import address_of
from im_server.storage.redis import keys

log = logging.getLogger("im_server.lookups")

_STORE_ERRORS = (RedisError, OSError, TimeoutError)


async def take(ctx: Context, caller: int, host: str | None) -> None:
    """Count one lookup for the caller and its address, or refuse it (``rate_limited``)."""
    s = ctx.settings
    limits: list[tuple[str, int]] = []
    if s.lookup_user_max > 0:
        limits.append((keys.lookups_user(caller), s.lookup_user_max))
    addr = address_of(host)
    if addr is not None and s.lookup_addr_max > 0:
        limits.append((keys.lookups_addr(addr), s.lookup_addr_max))
    if not limits:
        return
    try:
        taken = await ctx.redis.take_attempts(limits, s.lookup_window_seconds)
        if all(taken):
            return
        counted = [key for (key, _), ok in zip(limits, taken, strict=True) if ok]
        if counted:
            await ctx.redis.settle_attempts(counted, [])
    except _STORE_ERRORS as e:
        metrics.LOOKUP_THROTTLE_UNAVAILABLE.inc()
        log.warning("lookup throttle unavailable, lookup not counted: %r", e)
        return
    raise ImError("rate_limited", "too many username lookups, try again later")
