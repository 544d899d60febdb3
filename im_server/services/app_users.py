"""The app's users, by the app's own ids: create or update, import in bulk, read,
delete, mint tokens, revoke every token. Called by the server API (``api/server.py``)
for a key with the ``users`` scope."""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass

from im_server.context import Context
from im_server.errors import bad_request, not_found
from im_server.names import check_display_name
from im_server.services import deletion
from im_server.services.accounts import check_device_id, revoked, token_hash
from im_server.storage import accounts, app_users
from im_server.storage import webhooks as webhook_store
from im_server.storage.app_users import AppUser, Upserted
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.app_users")

EXTERNAL_ID = re.compile(r"^[A-Za-z0-9_.@:-]{1,128}$")
KINDS = ("user", "bot")
IMPORT_MAX = 10_000
TTL_MIN_S = 60


def check_external_id(value: str, field: str = "external_id") -> str:
    if not EXTERNAL_ID.fullmatch(value):
        raise bad_request(f"{field}: 1-128 characters of [A-Za-z0-9_.@:-]")
    return value


def _display(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= app_users.DISPLAY_NAME_MAX:
        raise bad_request("display_name: 1-64 characters")
    return check_display_name(value, "display_name")


@dataclass(slots=True, frozen=True)
class NewAppUser:
    external_id: str
    display_name: str | None = None
    kind: str | None = None


async def upsert(ctx: Context, users: list[NewAppUser]) -> list[Upserted]:
    """Create or update the users, in one transaction, in the order given."""
    if not users:
        raise bad_request("users: at least one")
    if len(users) > IMPORT_MAX:
        raise bad_request(f"users: at most {IMPORT_MAX}")
    ids = [check_external_id(u.external_id) for u in users]
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise bad_request(f"users: external_id {i!r} appears twice")
        seen.add(i)
    names = [_display(u.display_name) for u in users]
    kinds = [u.kind for u in users]
    if any(k is not None and k not in KINDS for k in kinds):
        raise bad_request("kind: user or bot")
    async with ctx.db.begin() as conn:
        out = await app_users.upsert_many(conn, ids, names, kinds, now_ms())
        made = [u.user_id for u in out if u.created]
        await webhook_store.user_events(conn, made, "user.created", now_ms())
    created = sum(u.created for u in out)
    if created:
        log.info("%d app user(s) created, %d updated", created, len(out) - created)
    return out


async def get(ctx: Context, external_id: str) -> AppUser:
    async with ctx.db.connect() as conn:
        user = await app_users.by_external_id(conn, check_external_id(external_id))
    if user is None:
        raise not_found("no user has that external_id")
    return user


async def user_ids(ctx: Context, external_ids: list[str], field: str) -> list[int]:
    """The live users of these ids, in order; ``not_found`` naming the first missing."""
    for e in external_ids:
        check_external_id(e, field)
    async with ctx.db.connect() as conn:
        found = await app_users.user_ids_of(conn, external_ids)
    missing = [e for e in external_ids if e not in found]
    if missing:
        raise not_found(f"{field}: no user has the external_id {missing[0]!r}")
    return [found[e] for e in external_ids]


async def delete(ctx: Context, external_id: str) -> None:
    """The account deletion of ``DELETE /v1/me``, without a password."""
    user = await get(ctx, external_id)
    await deletion.delete_account(ctx, user.user_id)


@dataclass(slots=True, frozen=True)
class Minted:
    token: str
    user_id: int
    device_id: str
    expires_at: int | None


async def mint_token(
    ctx: Context, external_id: str, device_id: str | None, ttl_s: int | None
) -> Minted:
    """A session for the user, like a login's (it replaces the device's session, is
    listed and revocable); with ``ttl_s`` it also ends then."""
    user = await get(ctx, external_id)
    device = check_device_id(secrets.token_hex(8) if device_id is None else device_id)
    max_s = int(ctx.settings.minted_token_max_days * 86_400)
    if ttl_s is not None and not TTL_MIN_S <= ttl_s <= max_s:
        raise bad_request(f"ttl_s: {TTL_MIN_S}-{max_s} seconds")
    token = secrets.token_urlsafe(32)
    now = now_ms()
    expires = now + ttl_s * 1000 if ttl_s is not None else None
    async with ctx.db.begin() as conn:
        if await accounts.lock_user(conn, user.user_id) is None:
            raise not_found("no user has that external_id")
        replaced = await accounts.revoke_device(conn, user.user_id, device, now)
        await accounts.create_session(conn, token_hash(token), user.user_id, device, now, expires)
    revoked(ctx, [r.token_hash for r in replaced])
    return Minted(token, user.user_id, device, expires)


async def revoke_tokens(ctx: Context, external_id: str) -> None:
    """Every session of the user, and every app-signed token issued before now, stop
    working; the user's sockets close (4401) on every process."""
    user = await get(ctx, external_id)
    now = now_ms()
    async with ctx.db.begin() as conn:
        await app_users.set_tokens_valid_after(conn, user.user_id, now)
        hashes = await accounts.revoke_user_sessions(conn, user.user_id, now)
    revoked(ctx, hashes)
    ctx.events.invalidate("user_tokens", str(user.user_id))
