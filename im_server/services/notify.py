"""Wake the long polls of users whose conversation states changed (after the commit):
in this process directly, elsewhere through the users' channels, and only for users
that are long-polling somewhere (listed in Redis): nothing is published otherwise."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from im_server.context import Context
from im_server.storage import conversations
from im_server.storage.redis import keys

log = logging.getLogger("im_server.notify")
SYNC_WAKE = "\x00sync"


async def changed(ctx: Context, user_ids: Iterable[int]) -> None:
    users = sorted(set(user_ids))
    if not users:
        return
    polls = ctx.extra.get("longpolls")
    if polls is not None:
        polls.wake(users)
    try:
        waiting = await ctx.redis.long_polling(users)
        if waiting:
            payload = ctx.settings.node_name + "\n" + SYNC_WAKE
            await ctx.redis.publish_many([(keys.user_channel(u), payload) for u in waiting])
    except Exception as e:  # noqa: BLE001 - a long poll still answers at its deadline
        log.debug("sync wake failed: %r", e)


async def conversations_changed(ctx: Context, conv_ids: list[str]) -> None:
    """After messages were persisted: wake the active members of these conversations.
    Nobody long-polling anywhere (the usual case under load: devices with a socket get
    pushes) costs one Redis read and no query. Checked after the commit, so a poll that
    registered before its own look at the data is always seen."""
    polls = ctx.extra.get("longpolls")
    try:
        anyone = (polls is not None and bool(polls.waiters)) or await ctx.redis.any_long_polls()
    except Exception:  # noqa: BLE001
        anyone = True
    if not anyone:
        return
    try:
        async with ctx.db.connect() as conn:
            users = await conversations.active_members_of(conn, conv_ids)
    except Exception as e:  # noqa: BLE001
        log.debug("sync wake lookup failed: %r", e)
        return
    await changed(ctx, users)
