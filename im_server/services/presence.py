"""Presence: a user is online while some live process holds one of its WebSockets.

Each process records which users it holds (``do_record``, driven by the gateway's
tracker from its hub) and lists itself as alive (``do_beat``); a process that stops
beating is taken for dead ``presence_node_ttl_seconds`` later, and the sweep of any
surviving process (``do_sweep``) takes its users offline. The state lives in Redis, so
announcements are driven from it, not from the memory of one process: an online is
announced by the process that recorded it; an offline is queued in Redis with a due
time and announced by whichever process sweeps it first, so a process killed -9 still
gets its users' offlines announced.

Coalescing: an offline is announced only after the user stayed offline for
``presence_offline_grace_seconds``; an online is announced at once, except right after
an offline that was never announced (a reconnect within the grace): then neither is.

Who sees whom (``storage/presence.py``): friends on both sides, neither having removed
nor blocked the other. Announcements go to those friends' user channels only (never
to groups)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

from im_server.context import Context
from im_server.errors import bad_request
from im_server.protocol import server_frames
from im_server.protocol.ids import MAX_ID
from im_server.storage import presence as presence_db

MAX_USER_IDS = 200
MAX_QUERY_CHARS = MAX_USER_IDS * 21  # 200 ids of up to 20 digits, and the commas
SWEEP_BATCH = 1000


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def check_user_ids(raw: str) -> list[int]:
    """``user_ids=1,2,3``: 1 to MAX_USER_IDS positive 64-bit ids; repeats answered once,
    in the order first given."""
    if len(raw) > MAX_QUERY_CHARS:
        raise bad_request(f"user_ids: at most {MAX_USER_IDS} ids")
    parts = raw.split(",")
    ids: dict[int, None] = {}
    for p in parts:
        if not (p.isascii() and p.isdigit() and len(p) <= 20):
            raise bad_request("user_ids must be comma-separated positive 64-bit integers")
        v = int(p)
        if not 0 < v <= MAX_ID:
            raise bad_request("user_ids must be comma-separated positive 64-bit integers")
        ids[v] = None
    if len(ids) > MAX_USER_IDS:
        raise bad_request(f"user_ids: at most {MAX_USER_IDS} ids")
    return list(ids)


async def presence(ctx: Context, me: int, raw: str) -> list[dict[str, Any]]:
    """The presence of each user I may see (myself included); nulls for the others."""
    ids = check_user_ids(raw)
    others = [u for u in ids if u != me]
    visible = {me}
    if others:
        async with ctx.db.connect() as conn:
            visible.update(await presence_db.presence_peers(conn, me, others))
    shown = [u for u in ids if u in visible]
    states = (
        dict(
            zip(
                shown,
                await ctx.redis.presence(shown, _ms(ctx.settings.presence_node_ttl_seconds)),
                strict=True,
            )
        )
        if shown
        else {}
    )
    out: list[dict[str, Any]] = []
    for u in ids:
        online, last_seen = states.get(u, (None, None))
        out.append({"user_id": u, "online": online, "last_seen": last_seen})
    return out


async def announce(ctx: Context, user_id: int, online: bool, last_seen: int | None) -> None:
    """Push the user's ``presence`` frame to the devices of the friends who see it."""
    async with ctx.db.connect() as conn:
        peers = await presence_db.presence_peers(conn, user_id)
    if peers:
        frame = server_frames.encode(server_frames.presence_push(user_id, online, last_seen))
        ctx.events.push(peers, frame)


async def do_record(
    ctx: Context, node: str, users: Sequence[tuple[int, Collection[str]]]
) -> list[int]:
    """Record (user, its devices with a connection on this node; none: the user has no
    connection here) and announce who came online; the users announced. The devices are
    what ``connected_devices`` answers for the pusher."""
    s = ctx.settings
    online = await ctx.redis.presence_set(
        node,
        users,
        _ms(s.presence_offline_grace_seconds),
        _ms(s.presence_last_seen_days * 86400),
    )
    await asyncio.gather(*(announce(ctx, u, True, None) for u in online))
    return online


async def connected_devices(ctx: Context, user_ids: Collection[int]) -> dict[int, set[str]]:
    """Per user: the device ids with an open WebSocket on some live process (empty: none),
    for pushing to the others. A killed process's devices stop counting once its node
    entry expired (``presence_node_ttl_seconds`` after its last beat)."""
    return await ctx.redis.connected_devices(user_ids)


async def do_beat(ctx: Context, node: str) -> bool:
    """List this node as alive; True when its users must be recorded again."""
    return await ctx.redis.presence_beat(node, _ms(ctx.settings.presence_node_ttl_seconds))


async def do_sweep(ctx: Context) -> list[tuple[int, int]]:
    """Take over dead nodes' users, announce the offlines that are due; those announced."""
    due = await ctx.redis.presence_sweep(
        _ms(ctx.settings.presence_last_seen_days * 86400),
        SWEEP_BATCH,
        _ms(ctx.settings.presence_node_ttl_seconds),
    )
    await asyncio.gather(*(announce(ctx, u, False, seen) for u, seen in due))
    return due
