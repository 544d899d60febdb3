"""Accounts and sessions: argon2id password hashes, random bearer tokens stored as
SHA-256 (a leaked table gives no usable token).

A session is one device's token: logging in again on a device replaces its session. A
token stops working when it is revoked (log out, log out of a device or everywhere, a
password change, a new login on the same device) or when it has not been used for
``IM_SESSION_IDLE_DAYS``. Every revocation drops the token from the checked-token cache
of every process and closes its sockets (4401) through the control channel; the
periodic re-check of open sockets (``gateway/recheck.py``) catches a notice that got
lost."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from functools import lru_cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from im_server import metrics
from im_server.config import Settings
from im_server.context import Context, Session
from im_server.context.app_tokens import TOKEN_MAX
from im_server.errors import ImError, bad_request, check_text, not_found
from im_server.names import NameRefused, check_display_name, normalize_username, username_key
from im_server.services import app_signed, device_labels, login_throttle, quotas
from im_server.storage import accounts as store
from im_server.storage import app_users
from im_server.storage import webhooks as webhook_store
from im_server.storage.db import now_ms

_DEVICE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
DAY_MS = 86_400_000


@lru_cache(maxsize=8)
def _hasher(time_cost: int, memory_kib: int, parallelism: int) -> PasswordHasher:
    return PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)


@lru_cache(maxsize=8)
def _dummy_hash(time_cost: int, memory_kib: int, parallelism: int) -> str:
    """A hash of a random secret with the same parameters as the real ones: a login for
    an unknown username is verified against it, so it costs what a wrong password does."""
    return _hasher(time_cost, memory_kib, parallelism).hash(secrets.token_urlsafe(32))


def _ph(ctx: Context) -> PasswordHasher:
    s = ctx.settings
    return _hasher(s.argon2_time_cost, s.argon2_memory_kib, s.argon2_parallelism)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def idle_cutoff(s: Settings, now: int) -> int:
    """Sessions last used before this (ms) are expired; 0 when idle expiry is off."""
    if s.session_idle_days <= 0:
        return 0
    return now - int(s.session_idle_days * DAY_MS)


def touch_interval_ms(s: Settings) -> int:
    """How stale ``last_used_at`` may get before a use writes it again: at most half the
    idle period, so a token in use never expires between two writes."""
    every = int(s.session_touch_seconds * 1000)
    if s.session_idle_days > 0:
        every = min(every, int(s.session_idle_days * DAY_MS) // 2)
    return max(every, 0)


# ---- checks ---------------------------------------------------------------------------------


def check_password(password: object, field: str = "password") -> str:
    if not isinstance(password, str) or not 8 <= len(password) <= 256:
        raise bad_request(f"{field}: 8-256 characters")
    return check_text(password, field)


RESERVED_DEVICE_IDS = frozenset({"current"})


def check_device_id(device_id: object) -> str:
    """The device id rule. ``current`` is reserved: ``DELETE /v1/sessions/current`` is
    this session's own path, so a device of that name could never be revoked by name
    from another device."""
    if not isinstance(device_id, str) or not _DEVICE.fullmatch(device_id):
        raise bad_request("device_id: 1-64 characters of letters, digits, '_', '.', ':', '-'")
    if device_id in RESERVED_DEVICE_IDS:
        raise bad_request(f"device_id: {device_id!r} is reserved, choose another name")
    return device_id


def check_registration(
    username: object, password: object, display_name: object
) -> tuple[str, str, str]:
    name = normalize_username(username)
    pw = check_password(password)
    if display_name is None:
        display_name = name
    if not isinstance(display_name, str) or not 1 <= len(display_name) <= 64:
        raise bad_request("display_name: 1-64 characters")
    return name, pw, check_display_name(display_name, "display_name")


async def verify_password(ctx: Context, password_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches; with no hash (no such user) the password is checked
    against the dummy hash all the same, and the answer is False."""
    s = ctx.settings
    ph = _ph(ctx)

    def run() -> bool:
        stored = password_hash
        if stored is None:
            stored = _dummy_hash(s.argon2_time_cost, s.argon2_memory_kib, s.argon2_parallelism)
        try:
            ok: bool = ph.verify(stored, password)
        except (VerificationError, InvalidHashError):
            ok = False
        return ok and password_hash is not None

    return await asyncio.to_thread(run)


# ---- register, log in, authenticate ---------------------------------------------------------


async def do_register(
    ctx: Context,
    username: object,
    password: object,
    display_name: object = None,
    client_host: str | None = None,
) -> dict[str, object]:
    """A new account. Counted per client address before the password is hashed (past the
    limit: ``rate_limited``, nothing hashed, nothing created)."""
    name, pw, display = check_registration(username, password, display_name)
    await quotas.registration(ctx, client_host)
    hashed = await asyncio.to_thread(_ph(ctx).hash, pw)
    async with ctx.db.begin() as conn:
        user_id = await store.create_user(conn, name, username_key(name), display, hashed)
        if user_id is not None:  # the app's webhooks hear of it in the same commit
            await webhook_store.user_events(conn, [user_id], "user.created", now_ms())
    if user_id is None:
        raise ImError("conflict", "username is taken")
    return {"user_id": user_id, "username": name}


def _bad_login() -> ImError:
    metrics.LOGINS.labels("refused").inc()
    return ImError("unauthorized", "bad username or password")


async def do_login(
    ctx: Context,
    username: object,
    password: object,
    device_id: object = None,
    client_host: str | None = None,
    device_name: object = None,
    user_agent: str | None = None,
) -> dict[str, object]:
    """A token for the device, replacing the device's session, labelled with the name
    given or the browser and platform of ``user_agent``. Throttled before any
    password is checked; an unknown username is checked against the dummy hash, so it
    is refused exactly like a wrong password, in the same time."""
    if not isinstance(username, str) or not isinstance(password, str):
        raise _bad_login()
    if len(password) > 256 or "\x00" in password:
        raise _bad_login()  # no account can have such a password
    check_text(password, "password")
    device = check_device_id(secrets.token_hex(8) if device_id is None else device_id)
    given_name = device_labels.check_device_name(device_name)
    try:
        name = normalize_username(username)
    except NameRefused:
        raise _bad_login() from None  # no account can have it
    key = username_key(name)
    attempt = await login_throttle.begin(ctx, key, client_host)
    try:
        async with ctx.db.connect() as conn:
            user = await store.user_by_name(conn, name, key)
        ok = await verify_password(ctx, user.password_hash if user else None, password)
    except Exception:
        await login_throttle.give_back(ctx, attempt)  # no check happened: no failure
        raise
    if user is None or not ok:
        raise _bad_login()
    await login_throttle.succeeded(ctx, attempt)
    token = secrets.token_urlsafe(32)
    label = await device_labels.session_label(given_name, user_agent)
    h, now = token_hash(token), now_ms()
    async with ctx.db.begin() as conn:
        if await store.lock_user(conn, user.user_id) != user.password_hash:
            # the password changed while this one was being checked
            raise _bad_login()
        replaced = await store.revoke_device(conn, user.user_id, device, now)
        await store.create_session(conn, h, user.user_id, device, now, label=label)
    _revoked(ctx, [r.token_hash for r in replaced])
    metrics.LOGINS.labels("ok").inc()
    return {"token": token, "user_id": user.user_id, "device_id": device}


async def authenticate(ctx: Context, token: str | None) -> Session:
    """The session of a live token (a session's, or an app-signed JWT when keys for them
    are configured), or ``unauthorized``. Cached per process until the token's end; a
    revoke drops the entry everywhere through the control channel. A use of a session
    writes ``last_used_at`` when it is older than the touch interval."""
    jwt = bool(token) and ctx.app_tokens.configured and ctx.app_tokens.looks_like_jwt(token or "")
    if not token or len(token) > (TOKEN_MAX if jwt else 256):
        raise ImError("unauthorized", "missing or bad token")
    h = token_hash(token)
    s, now = ctx.settings, now_ms()
    hit = ctx.auth_cache.get(h)
    if hit is not None and (hit.expires_at is None or hit.expires_at > now):
        return hit
    if jwt:
        session = await app_signed.session_of(ctx, token)
        ctx.auth_cache.put(h, session)
        return session
    try:
        async with ctx.db.connect() as conn:
            row = await store.live_session(conn, h, idle_cutoff(s, now), now)
        if row is not None and row.last_used_at < now - touch_interval_ms(s):
            async with ctx.db.begin() as conn:
                await store.touch_session(conn, h, now)
    except Exception as e:  # the store is down: the caller cannot be authenticated
        raise ImError("unavailable", "cannot check the token now") from e
    if row is None:
        raise ImError("unauthorized", "missing or bad token")
    session = Session(row.user_id, row.device_id, expires_at=row.expires_at)
    ctx.auth_cache.put(h, session)
    return session


async def live_tokens(ctx: Context, hashes: list[bytes]) -> set[bytes]:
    """Which of these token hashes are still live; those last written before the touch
    interval are marked used now (their sockets are open). One statement per 10 000."""
    s, now = ctx.settings, now_ms()
    live: set[bytes] = set()
    for i in range(0, len(hashes), 10_000):
        async with ctx.db.begin() as conn:
            live |= await store.live_of(
                conn,
                hashes[i : i + 10_000],
                idle_cutoff(s, now),
                now,
                now - touch_interval_ms(s),
            )
    return live


async def token_floors(ctx: Context, user_ids: list[int]) -> dict[int, int | None]:
    """Each live user's "revoke every token before" time (ms, None: never); deleted
    users are left out."""
    out: dict[int, int | None] = {}
    for i in range(0, len(user_ids), 10_000):
        async with ctx.db.connect() as conn:
            out |= await app_users.token_floors(conn, user_ids[i : i + 10_000])
    return out


def revoked(ctx: Context, hashes: list[bytes]) -> None:
    """Tell every process that these tokens are dead (see ``_revoked``)."""
    _revoked(ctx, hashes)


def _revoked(ctx: Context, hashes: list[bytes]) -> None:
    """Tell every process (this one too) that these tokens are dead: the cache entries go
    and their sockets close with 4401."""
    for h in hashes:
        ctx.auth_cache.drop(h)
        ctx.events.invalidate("token", h.hex())


# ---- sessions -------------------------------------------------------------------------------


async def do_logout(ctx: Context, token: str) -> None:
    h = token_hash(token)
    async with ctx.db.begin() as conn:
        await store.revoke_session(conn, h, now_ms())
    _revoked(ctx, [h])


async def sessions(ctx: Context, user_id: int, token: str) -> list[dict[str, object]]:
    """My live sessions; ``current`` marks the one of the token asking."""
    mine = token_hash(token)
    async with ctx.db.connect() as conn:
        now = now_ms()
        rows = await store.live_sessions(conn, user_id, idle_cutoff(ctx.settings, now), now)
    return [
        {
            "device_id": r.device_id,
            "label": r.label,
            "created_at": r.created_at,
            "last_used_at": r.last_used_at,
            "current": r.token_hash == mine,
        }
        for r in rows
    ]


async def do_revoke_device(ctx: Context, user_id: int, device_id: object) -> None:
    """Revoke my session on a device; ``not_found`` when I have no live one there (an
    idle-expired one is revoked all the same)."""
    device = check_device_id(device_id)
    now = now_ms()
    async with ctx.db.begin() as conn:
        rows = await store.revoke_device(conn, user_id, device, now)
    _revoked(ctx, [r.token_hash for r in rows])
    cutoff = idle_cutoff(ctx.settings, now)
    if not any(r.last_used_at >= cutoff for r in rows):
        raise not_found("no live session on that device")


async def do_logout_everywhere(ctx: Context, user_id: int) -> None:
    async with ctx.db.begin() as conn:
        revoked = await store.revoke_user_sessions(conn, user_id, now_ms())
    _revoked(ctx, revoked)


async def confirm_password(
    ctx: Context, user_id: int, password: str, client_host: str | None
) -> store.UserRow:
    """The signed-in user's own password, checked like a login (throttled, a wrong one
    counted as a failed login): the user's row, or ``unauthorized``."""
    async with ctx.db.connect() as conn:
        user = await store.user_by_id(conn, user_id)
    if user is None or user.deleted:
        raise ImError("unauthorized", "user is gone")
    attempt = await login_throttle.begin(ctx, username_key(user.username), client_host)
    try:
        ok = len(password) <= 256 and await verify_password(ctx, user.password_hash, password)
    except Exception:
        await login_throttle.give_back(ctx, attempt)
        raise
    if not ok:
        metrics.LOGINS.labels("refused").inc()
        raise ImError("unauthorized", "wrong password")
    await login_throttle.succeeded(ctx, attempt)
    return user


async def do_change_password(
    ctx: Context,
    user_id: int,
    token: str,
    old_password: object,
    new_password: object,
    client_host: str | None = None,
) -> None:
    """Check the old password (throttled and counted like a login), set the new one and
    revoke every other session of mine."""
    new = check_password(new_password, "new_password")
    if not isinstance(old_password, str):
        raise bad_request("old_password: a string")
    check_text(old_password, "old_password")
    user = await confirm_password(ctx, user_id, old_password, client_host)
    hashed = await asyncio.to_thread(_ph(ctx).hash, new)
    async with ctx.db.begin() as conn:
        if await store.lock_user(conn, user_id) != user.password_hash:
            raise ImError("conflict", "the password was changed meanwhile")
        await store.set_password_hash(conn, user_id, hashed)
        revoked = await store.revoke_user_sessions(conn, user_id, now_ms(), keep=token_hash(token))
    _revoked(ctx, revoked)


# ---- users ----------------------------------------------------------------------------------
