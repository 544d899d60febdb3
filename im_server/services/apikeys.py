"""API keys of the app's servers: ``imk_`` + 32 random bytes, shown once, stored as
SHA-256 (a key is random, so a fast hash gives nothing to guess), with scopes.

A key is checked per request against a per-process cache of five seconds, so a key
revoked by ``im-server apikey revoke`` (another process, maybe with no server around)
stops working everywhere within five seconds, with no notice to deliver. A key never
works as a user token: keys start ``imk_`` and live in their own table, and
``X-Api-Key`` is the only place one is read."""

from __future__ import annotations

import hashlib
import re
import secrets

from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.context import Context
from im_server.errors import ImError, bad_request, unavailable
from im_server.storage import apikeys as store
from im_server.storage.apikeys import ApiKeyRow
from im_server.storage.db import now_ms

SCOPES = ("users", "messages", "groups", "webhooks")
ALL = "all"
PREFIX = "imk_"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TOUCH_MS = 60_000  # last_used_at is written at most once a minute per key and process


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise bad_request("name: 1-64 characters of [A-Za-z0-9_.-]")
    return name


def check_scopes(scopes: list[str]) -> list[str]:
    """Known scopes, each once; ``all`` stands alone."""
    out = sorted({s.strip() for s in scopes if s.strip()})
    if not out:
        raise bad_request("scope: at least one of " + ", ".join((*SCOPES, ALL)))
    unknown = [s for s in out if s not in (*SCOPES, ALL)]
    if unknown:
        raise bad_request(f"unknown scope {unknown[0]!r:.40}: one of " + ", ".join((*SCOPES, ALL)))
    return [ALL] if ALL in out else out


async def create(db: AsyncEngine, name: str, scopes: list[str]) -> str:
    """A new key (returned once: only its hash is kept); ``conflict`` if a live key has
    that name."""
    name, scopes = check_name(name), check_scopes(scopes)
    key = PREFIX + secrets.token_urlsafe(32)
    async with db.begin() as conn:
        if await store.create(conn, name, key_hash(key), scopes, now_ms()) is None:
            raise ImError("conflict", f"a live key is named {name!r}")
    return key


async def listed(db: AsyncEngine) -> list[ApiKeyRow]:
    async with db.connect() as conn:
        return await store.live(conn)


async def revoke(db: AsyncEngine, name: str) -> bool:
    async with db.begin() as conn:
        return await store.revoke(conn, check_name(name), now_ms()) is not None


def allows(key: ApiKeyRow, scope: str) -> bool:
    return ALL in key.scopes or scope in key.scopes


async def authenticate(ctx: Context, key: str | None) -> ApiKeyRow:
    """The live key, or ``unauthorized`` (no key, a user token, a revoked key)."""
    if not key or not key.startswith(PREFIX) or len(key) > 128:
        raise ImError("unauthorized", "send X-Api-Key: <an API key of this server>")
    h = key_hash(key)
    hit = ctx.api_key_cache.get(h)
    if hit is not None:
        return hit
    now = now_ms()
    try:
        async with ctx.db.connect() as conn:
            row = await store.by_hash(conn, h)
        if row is not None and (row.last_used_at or 0) < now - TOUCH_MS:
            async with ctx.db.begin() as conn:
                await store.touch(conn, row.key_id, now)
    except Exception as e:  # the store is down: the key cannot be checked
        raise unavailable("cannot check the API key now") from e
    if row is None:
        raise ImError("unauthorized", "unknown or revoked API key")
    ctx.api_key_cache.put(h, row)
    return row
