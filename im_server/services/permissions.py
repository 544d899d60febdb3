"""Who may send where. The answer is cached in Redis (read by the send script in the
same round trip as the seq allocation); this module fills that cache from PostgreSQL.

A lookup that fails or times out lets a single-chat message through (friendship and
blocks are a side path that must not stop chat: the seed's rule), but refuses a group
message with ``unavailable``: letting it through would let a kicked member post."""

from __future__ import annotations

import asyncio
import logging

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, unavailable
from im_server.protocol.ids import ConvRef
from im_server.storage import contacts, memberships
from im_server.storage.db import now_ms
from im_server.storage.redis.replies import RefusalCode

log = logging.getLogger("im_server.permissions")

DENIED: dict[RefusalCode, str] = {
    "not_friends": "you are not friends (or one side removed the other)",
    "blocked": "the receiver blocked you",
    "not_member": "you are not a member of this conversation",
    "muted": "an admin of this group muted you for now",
}
PERM_TTL_SECONDS = 24 * 3600


async def send_statuses(ctx: Context, ref: ConvRef) -> dict[int, str]:
    async with ctx.db.connect() as conn:
        if ref.kind == "single":
            return await contacts.single_send_statuses(conn, ref.a, ref.b)
        now = now_ms()
        return {
            uid: "ok" if until is None or until <= now else f"muted:{until}"
            for uid, until in await memberships.active_member_mutes(conn, ref.conv_id)
        }


async def load_send_permissions(ctx: Context, ref: ConvRef, epoch: str) -> bool:
    """Fill the cache. When the lookup fails or takes longer than the store timeout:
    False for a single chat (the caller lets the send through), ``unavailable`` for a
    group."""
    try:
        statuses = await asyncio.wait_for(
            send_statuses(ctx, ref), ctx.settings.store_timeout_seconds
        )
    except Exception as e:  # any store failure, a timeout included
        metrics.PERMISSION_LOOKUP_FAILURES.inc()
        if ref.kind == "group":
            log.warning("membership lookup for %s failed, refusing the send: %r", ref.conv_id, e)
            raise unavailable("group membership cannot be checked now, try again") from e
        log.warning("permission lookup for %s failed, letting the send through: %r", ref.conv_id, e)
        return False
    await ctx.redis.load_perm(ref.conv_id, epoch, statuses, PERM_TTL_SECONDS)
    return True


async def permissions_changed(ctx: Context, conv_ids: list[str]) -> None:
    """Call after a committed change of friendship, block, removal or membership."""
    try:
        await ctx.redis.invalidate_perm(conv_ids)
    except Exception as e:  # noqa: BLE001
        log.error("could not invalidate send permissions of %s: %r", conv_ids, e)
    for c in conv_ids:
        ctx.members_cache.drop(c)
        ctx.events.invalidate("members", c)


async def single_send_status(ctx: Context, ref: ConvRef, user_id: int) -> str:
    """'ok' or the refusal code for ``user_id`` writing in the single chat ``ref`` (the
    cache the send script reads, filled when cold); 'ok' when the lookup fails (a single
    chat fails open)."""
    assert ref.kind == "single"
    try:
        return await _cached_status(ctx, ref, user_id)
    except Exception:  # noqa: BLE001 - fail open, as the send does
        return "ok"


async def check_write(ctx: Context, ref: ConvRef, user_id: int) -> None:
    """Raise the refusal a send by ``user_id`` in ``ref`` would get now (see
    :func:`write_status`)."""
    st = await write_status(ctx, ref, user_id)
    if st != "ok":
        code: RefusalCode = st if st in DENIED else "not_member"
        raise ImError(code, DENIED[code])


async def write_status(ctx: Context, ref: ConvRef, user_id: int) -> str:
    """'ok', or the code a send by ``user_id`` in ``ref`` would be refused with now
    ('not_friends', 'blocked', 'not_member', 'muted'), read from the cache the send
    script reads and interpreted as it does. For what announces itself with a notice
    in the seq stream without being a send (a reaction): the same rules as a send.
    A failed lookup fails open in a single chat and raises ``unavailable`` in a group,
    as the send does."""
    if ref.kind == "single":
        return await single_send_status(ctx, ref, user_id)
    try:
        st = await _cached_status(ctx, ref, user_id)
    except ImError:
        raise
    except Exception as e:  # a store failure: a group fails closed
        metrics.PERMISSION_LOOKUP_FAILURES.inc()
        raise unavailable("group membership cannot be checked now, try again") from e
    if st.startswith("muted:"):
        return "muted" if int(st.removeprefix("muted:")) > now_ms() else "ok"
    return st


async def _cached_status(ctx: Context, ref: ConvRef, user_id: int) -> str:
    st = await ctx.redis.perm_status(ref.conv_id, user_id)
    if st is None:
        if not await load_send_permissions(ctx, ref, await ctx.redis.perm_epoch(ref.conv_id)):
            return "ok"  # a single chat whose lookup failed: open
        st = await ctx.redis.perm_status(ref.conv_id, user_id)
    return st or "ok"
