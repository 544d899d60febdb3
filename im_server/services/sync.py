"""Sync: the states of my conversations that changed after version V (oldest change
first), each with its newest messages; a long poll when nothing changed. The version
handed out is safe: versions are taken under one row lock inside each writing
transaction, so they become visible in order, and the answer's version is read in the
same snapshot as the changes (or is the last change's version when the page is cut)."""

from __future__ import annotations

import time
from typing import Any

from im_server.context import Context
from im_server.errors import ImError
from im_server.storage import conv_states, reactions, sync

WAIT_CAP_S = 30.0


async def _page(ctx: Context, user_id: int, since: int, limit: int, recent: int) -> dict[str, Any]:
    # one snapshot for the whole page: the changes, the counter, the re-read of a version
    # group cut by the limit, and the states themselves
    async with ctx.db.connect() as raw:
        conn = await raw.execution_options(isolation_level="REPEATABLE READ")
        await conn.begin()
        changed, cur = await sync.changed_since(conn, user_id, since, limit)
        has_more = len(changed) > limit
        if has_more:
            # cut at a version boundary: a state left out must have a higher version
            # than the one handed back, or the next call would skip it
            boundary = changed[limit - 1][1]
            page = (
                [c for c in changed[:limit] if c[1] < boundary]
                if changed[limit][1] == boundary
                else changed[:limit]
            )
            if not page:  # one version holds more than `limit` states: return them all
                page, _ = await sync.changed_since(conn, user_id, boundary - 1, 1_000_000)
                page = [c for c in page if c[1] == boundary]
            version = page[-1][1]
        else:
            page = changed
            version = cur
        if not page:
            return {"version": since, "conversations": [], "has_more": False}
        ids = [c for c, _ in page]
        states = {
            s["conv_id"]: s
            for s in await conv_states.states(conn, user_id, conv_ids=ids, include_hidden=True)
        }
        windows = [(c, states[c]["min_seq"], states[c]["max_seq"]) for c in ids if c in states]
        msgs = await sync.recent_messages(conn, windows, recent)
        await reactions.attach(
            conn,
            user_id,
            [m for ms in msgs.values() for m in ms]
            + [s["last_message"] for s in states.values() if s["last_message"]],
        )
    out = []
    for c in ids:
        st = states.get(c)
        if st is None:
            continue
        st["messages"] = msgs.get(c, [])
        out.append(st)
    return {"version": version, "conversations": out, "has_more": has_more}


async def do_sync(
    ctx: Context, user_id: int, since: int, wait: float, limit: int, recent: int
) -> dict[str, Any]:
    wait = max(0.0, min(wait, WAIT_CAP_S))
    if wait <= 0:
        return await _page(ctx, user_id, since, limit, recent)
    polls = ctx.long_polls
    if polls.count(user_id) >= ctx.settings.sync_long_polls_per_user:
        # checked and registered below with no await in between: the bound is exact
        raise ImError(
            "rate_limited",
            f"at most {ctx.settings.sync_long_polls_per_user} long polls of one user at once",
        )
    deadline = time.monotonic() + wait
    while True:
        # register before looking, so a change committed in between still wakes us
        async with polls.waiting(user_id) as woken:
            res = await _page(ctx, user_id, since, limit, recent)
            left = deadline - time.monotonic()
            if res["conversations"] or left <= 0:
                return res
            await woken(left)
        if time.monotonic() >= deadline:
            return await _page(ctx, user_id, since, limit, recent)
