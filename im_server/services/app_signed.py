"""The user an app-signed token (a JWT of the app's) speaks for.

The token's ``sub`` is the app's id for the user; a user of that id is created on the
token's first use (its ``name`` claim, when it is a valid display name, becomes the
display name). The token is refused when it was issued before the user's "revoke every
token" time, or before the user was deleted; a token without ``iat`` is refused once
either of those exists (nothing says it is newer)."""

from __future__ import annotations

from im_server.context import Context, Session
from im_server.context.app_tokens import AppTokenRefused, Claims, KeysUnavailable
from im_server.errors import ImError, unavailable
from im_server.names import NameRefused, check_display_name
from im_server.storage import app_users
from im_server.storage import webhooks as webhook_store
from im_server.storage.db import now_ms

APP_DEVICE = "app"  # the device of a token without a device_id claim


def _display_name(claims: Claims) -> str | None:
    if claims.name is None or not 1 <= len(claims.name) <= app_users.DISPLAY_NAME_MAX:
        return None
    try:
        return check_display_name(claims.name, "name")
    except NameRefused:
        return None


def _issued_before(claims: Claims, floor: int | None) -> bool:
    return floor is not None and (claims.iat is None or claims.iat * 1000 < floor)


async def session_of(ctx: Context, token: str) -> Session:
    """The session of a valid app-signed token, or ``unauthorized`` saying why."""
    try:
        claims = await ctx.app_tokens.verify(token)
    except AppTokenRefused as e:
        raise ImError("unauthorized", f"app token refused: {e}") from None
    except KeysUnavailable as e:
        raise unavailable(str(e)) from None
    try:
        async with ctx.db.connect() as conn:
            owner = await app_users.token_owner(conn, claims.sub)
        if owner is not None and owner.deleted_at is not None:
            if _issued_before(claims, owner.deleted_at):
                raise ImError("unauthorized", "app token refused: the user was deleted")
            owner = None  # a token issued after the deletion: a new user of that id
        if owner is None:
            async with ctx.db.begin() as conn:
                made = await app_users.upsert_many(
                    conn, [claims.sub], [_display_name(claims)], [None], now_ms()
                )
                if made[0].created:
                    await webhook_store.user_events(
                        conn, [made[0].user_id], "user.created", now_ms()
                    )
            user_id, floor = made[0].user_id, None
        else:
            user_id, floor = owner.user_id, owner.tokens_valid_after
    except ImError:
        raise
    except Exception as e:  # the store is down: the caller cannot be authenticated
        raise unavailable("cannot check the token now") from e
    if _issued_before(claims, floor):
        raise ImError("unauthorized", "app token refused: revoked")
    return Session(
        user_id,
        claims.device_id or APP_DEVICE,
        expires_at=claims.exp * 1000,
        app_signed=True,
        issued_at=claims.iat * 1000 if claims.iat is not None else None,
    )
