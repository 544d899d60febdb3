"""Wake the long polls of users whose conversation states changed (after the commit):
in this process directly, elsewhere through the inboxes of the processes holding them,
and only for users that are long-polling somewhere (listed in Redis): nothing is
published otherwise."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from im_server.context import Context
from im_server.storage import memberships
from im_server.storage.redis import pubsub

log = logging.getLogger("im_server.notify")


async def changed(ctx: Context, user_ids: Iterable[int]) -> None:
    users = sorted(set(user_ids))
    if not users:
        return
    ctx.long_polls.wake(users)
    try:
        waiting = await ctx.redis.long_polling(users)
        if waiting:
            await pubsub.send_to_users(
                ctx.redis, ctx.settings.node_name, [(waiting, pubsub.SYNC_WAKE)]
            )
    except Exception as e:  # noqa: BLE001 - a long poll still answers at its deadline
        log.debug("sync wake failed: %r", e)


async def conversations_changed(ctx: Context, conv_ids: list[str]) -> None:
    """After messages were persisted: wake the active members of these conversations.
    Nobody long-polling anywhere (the usual case under load: devices with a socket get
    pushes) costs one Redis read and no query. Checked after the commit, so a poll that
    registered before its own look at the data is always seen."""
    try:
        anyone = ctx.long_polls.waiting_any() or await ctx.redis.any_long_polls()
    except Exception:  # noqa: BLE001 - Redis down: look, rather than miss a waiter
        anyone = True
    if not anyone:
        return
    try:
        async with ctx.db.connect() as conn:
            users = await memberships.active_members_of(conn, conv_ids)
    except Exception as e:  # noqa: BLE001
        log.debug("sync wake lookup failed: %r", e)
        return
    await changed(ctx, users)
