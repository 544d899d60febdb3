"""Accounts and sessions: argon2id password hashes, random bearer tokens stored as
SHA-256 (a leaked table gives no usable token)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from functools import lru_cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from im_server.context import Context
from im_server.errors import ImError, bad_request, check_text
from im_server.storage import accounts as store

_USERNAME = re.compile(r"^[A-Za-z0-9_.-]{3,32}$")
_DEVICE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@lru_cache(maxsize=8)
def _hasher(time_cost: int, memory_kib: int, parallelism: int) -> PasswordHasher:
    return PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)


def _ph(ctx: Context) -> PasswordHasher:
    s = ctx.settings
    return _hasher(s.argon2_time_cost, s.argon2_memory_kib, s.argon2_parallelism)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def check_registration(
    username: object, password: object, display_name: object
) -> tuple[str, str, str]:
    if not isinstance(username, str) or not _USERNAME.fullmatch(username):
        raise bad_request("username: 3-32 characters of letters, digits, '_', '.', '-'")
    if not isinstance(password, str) or not 8 <= len(password) <= 256:
        raise bad_request("password: 8-256 characters")
    check_text(password, "password")
    if display_name is None:
        display_name = username
    if not isinstance(display_name, str) or not 1 <= len(display_name) <= 64:
        raise bad_request("display_name: 1-64 characters")
    return username, password, check_text(display_name, "display_name")


async def do_register(
    ctx: Context, username: object, password: object, display_name: object = None
) -> dict[str, object]:
    name, pw, display = check_registration(username, password, display_name)
    hashed = await asyncio.to_thread(_ph(ctx).hash, pw)
    async with ctx.db.begin() as conn:
        user_id = await store.create_user(conn, name, display, hashed)
    if user_id is None:
        raise ImError("conflict", "username is taken")
    return {"user_id": user_id, "username": name}


async def do_login(
    ctx: Context, username: object, password: object, device_id: object = None
) -> dict[str, object]:
    if (
        not isinstance(username, str)
        or not isinstance(password, str)
        or len(password) > 256
        or not _USERNAME.fullmatch(username)
        or "\x00" in password
    ):
        raise ImError("unauthorized", "bad username or password")
    check_text(password, "password")
    if device_id is None:
        device_id = secrets.token_hex(8)
    if not isinstance(device_id, str) or not _DEVICE.fullmatch(device_id):
        raise bad_request("device_id: 1-64 characters of letters, digits, '_', '.', ':', '-'")
    async with ctx.db.connect() as conn:
        user = await store.user_by_name(conn, username)
    ok = False
    if user is not None:
        try:
            ok = await asyncio.to_thread(_ph(ctx).verify, user.password_hash, password)
        except (VerificationError, InvalidHashError):
            ok = False
    if not ok or user is None:
        raise ImError("unauthorized", "bad username or password")
    token = secrets.token_urlsafe(32)
    async with ctx.db.begin() as conn:
        await store.create_session(conn, token_hash(token), user.user_id, device_id)
    return {"token": token, "user_id": user.user_id, "device_id": device_id}


async def authenticate(ctx: Context, token: str | None) -> tuple[int, str]:
    """(user_id, device_id) of a live token, or ``unauthorized``. Cached per process;
    a revoke drops the entry everywhere through the control channel."""
    if not token or len(token) > 256:
        raise ImError("unauthorized", "missing or bad token")
    h = token_hash(token)
    hit = ctx.auth_cache.get(h)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    try:
        async with ctx.db.connect() as conn:
            row = await store.session_by_hash(conn, h)
    except Exception as e:  # the store is down: the caller cannot be authenticated
        raise ImError("unavailable", "cannot check the token now") from e
    if row is None:
        raise ImError("unauthorized", "missing or bad token")
    ctx.auth_cache.put(h, row)
    return row


async def do_logout(ctx: Context, token: str) -> None:
    h = token_hash(token)
    async with ctx.db.begin() as conn:
        await store.revoke_session(conn, h)
    ctx.auth_cache.drop(h)
    ctx.events.invalidate("token", h.hex())


async def me(ctx: Context, user_id: int) -> dict[str, object]:
    async with ctx.db.connect() as conn:
        user = await store.user_by_id(conn, user_id)
    if user is None:
        raise ImError("unauthorized", "user is gone")
    return {"user_id": user.user_id, "username": user.username, "display_name": user.display_name}


async def profile(ctx: Context, user_id: int) -> dict[str, object]:
    """Another user's public profile (what a client shows next to a user id)."""
    async with ctx.db.connect() as conn:
        user = await store.user_by_id(conn, user_id)
    if user is None:
        raise ImError("not_found", "no such user")
    return {"user_id": user.user_id, "username": user.username, "display_name": user.display_name}
