"""Who a user is: my own profile, another user's by id, a user by username.

Profiles by id must not walk the user base (ids are sequential): a profile of a user I
share nothing with (no conversation, no friendship, no pending request either way) is
counted against the same per-caller and per-address budget as a username lookup
(``services/quotas.py``). People I talk to, or who asked to, cost nothing."""

from __future__ import annotations

from im_server.context import Context
from im_server.errors import ImError, not_found
from im_server.names import normalize_username, username_key
from im_server.services import quotas
from im_server.storage import accounts as store
from im_server.storage import contacts


def _public(user: store.UserRow) -> dict[str, object]:
    return {
        "user_id": user.user_id,
        "username": user.username,
        "display_name": user.display_name,
        "kind": user.kind,
    }


async def me(ctx: Context, user_id: int) -> dict[str, object]:
    async with ctx.db.connect() as conn:
        user = await store.user_by_id(conn, user_id)
    if user is None or user.deleted:
        raise ImError("unauthorized", "user is gone")
    return _public(user)


async def profile(ctx: Context, caller: int, user_id: int, host: str | None) -> dict[str, object]:
    """Another user's public profile (what a client shows next to a user id); a deleted
    account answers ``{user_id, deleted: true}`` and nothing else. A stranger's (or a
    user id that names nobody) spends a lookup, before anything about it is read."""
    if caller != user_id:
        async with ctx.db.connect() as conn:
            related = await contacts.related(conn, caller, user_id)
        if not related:
            await quotas.lookup(ctx, caller, host)
    async with ctx.db.connect() as conn:
        user = await store.user_by_id(conn, user_id)
    if user is None:
        raise ImError("not_found", "no such user")
    if user.deleted:
        return {"user_id": user.user_id, "deleted": True}
    return _public(user)


async def lookup(
    ctx: Context, caller: int, username: object, host: str | None
) -> dict[str, object]:
    """The user with this username, compared as at registration (NFKC, case folded);
    every lookup spends one of the caller's lookups, found or not."""
    await quotas.lookup(ctx, caller, host)
    name = normalize_username(username)
    async with ctx.db.connect() as conn:
        user = await store.user_by_name(conn, name, username_key(name))
    if user is None:
        raise not_found("no such user")
    return _public(user)
