"""Push registrations: a phone's push address tied to the session that registered it.

One per session (a PUT replaces it); it dies with the session (every revocation deletes
it in its own transaction, ``storage/accounts.py``; an idle-expired session's is never
used). An (app_id, pushkey) belongs to one session only: registering it again from
another session (the app re-installed, another account signed in on the phone) moves it
there, so a phone never receives another session's, nor another account's, pushes."""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy.exc import IntegrityError

from im_server.context import Context
from im_server.errors import ImError, bad_request, check_text
from im_server.services.accounts import idle_cutoff, token_hash
from im_server.storage import push as store
from im_server.storage.db import now_ms

PLATFORMS = ("apns", "fcm", "webpush")
DATA_MAX_BYTES = 1024
_B64URL = re.compile(r"[A-Za-z0-9_-]{16,128}={0,2}")
_APP_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# printable ASCII, no space: hex APNs tokens, FCM tokens ([A-Za-z0-9_:-], ~160 characters)
_PUSHKEY = re.compile(r"[\x21-\x7e]{1,512}")
_ATTEMPTS = 3  # a race on the same pushkey with another session is retried


def check_registration(app_id: object, pushkey: object, platform: object) -> tuple[str, str, str]:
    if not isinstance(app_id, str) or not _APP_ID.fullmatch(app_id):
        raise bad_request("app_id: 1-64 characters of letters, digits, '.', '_', '-'")
    if not isinstance(pushkey, str) or not _PUSHKEY.fullmatch(pushkey):
        raise bad_request("pushkey: 1-512 printable ASCII characters, no spaces")
    if platform not in PLATFORMS:
        raise bad_request("platform: 'apns', 'fcm' or 'webpush'")
    assert isinstance(platform, str)
    return app_id, pushkey, platform


def check_data(platform: str, data: object) -> dict[str, Any]:
    """Web Push needs the subscription's ``endpoint`` (an https URL) and ``auth`` (base64url),
    and may carry the gateway's ``events_only`` (bool) and ``default_payload`` (an
    object), at most ``DATA_MAX_BYTES`` as JSON; the other platforms take none. The
    endpoint is the gateway's to call (it checks it against its allowed endpoints): this
    server never does."""
    if platform != "webpush":
        if data is not None:
            raise bad_request("data: only for platform 'webpush'")
        return {}
    if not isinstance(data, dict):
        raise bad_request("data: {endpoint, auth} is required for platform 'webpush'")
    extra = set(data) - {"endpoint", "auth", "events_only", "default_payload"}
    if extra:
        raise bad_request(f"data: unknown field {sorted(extra)[0]!r}")
    endpoint, auth = data.get("endpoint"), data.get("auth")
    if not isinstance(endpoint, str) or not endpoint.startswith("https://") or len(endpoint) > 800:
        raise bad_request("data.endpoint: the subscription's https URL (at most 800 characters)")
    check_text(endpoint, "data.endpoint")
    if any(c.isspace() for c in endpoint):
        raise bad_request("data.endpoint: the subscription's https URL (at most 800 characters)")
    if not isinstance(auth, str) or not _B64URL.fullmatch(auth):
        raise bad_request("data.auth: the subscription's keys.auth (base64url)")
    if "events_only" in data and not isinstance(data["events_only"], bool):
        raise bad_request("data.events_only: true or false")
    if "default_payload" in data and not isinstance(data["default_payload"], dict):
        raise bad_request("data.default_payload: an object")
    try:
        size = len(json.dumps(data, ensure_ascii=False).encode())
    except (TypeError, ValueError, UnicodeEncodeError):
        raise bad_request("data: not valid JSON text") from None
    if size > DATA_MAX_BYTES:
        raise bad_request(f"data: at most {DATA_MAX_BYTES} bytes as JSON")
    return dict(data)


async def do_register(
    ctx: Context,
    token: str,
    app_id: object,
    pushkey: object,
    platform: object,
    data: object = None,
) -> None:
    """Tie the registration to the session of ``token``; ``conflict`` when I hold the
    limit already, ``unauthorized`` when the session ended meanwhile."""
    app, key, plat = check_registration(app_id, pushkey, platform)
    extra = check_data(plat, data)
    h, s = token_hash(token), ctx.settings
    for attempt in range(_ATTEMPTS):
        now = now_ms()
        try:
            async with ctx.db.begin() as conn:
                result = await store.put(
                    conn,
                    h,
                    app,
                    key,
                    plat,
                    data=extra,
                    idle_cutoff=idle_cutoff(s, now),
                    limit=s.push_registrations_max,
                    now=now,
                )
        except IntegrityError:
            # another session took this pushkey at the same moment: try again, and the
            # newer of the two wins
            if attempt == _ATTEMPTS - 1:
                raise ImError("conflict", "the pushkey is being registered elsewhere") from None
            continue
        break
    if result is store.PutResult.NO_SESSION:
        raise ImError("unauthorized", "the session has ended")
    if result is store.PutResult.TOO_MANY:
        raise ImError("conflict", f"at most {s.push_registrations_max} push registrations per user")


async def do_unregister(ctx: Context, token: str) -> None:
    """Remove the registration of this session, if any."""
    async with ctx.db.begin() as conn:
        await store.delete_of_sessions(conn, [token_hash(token)])


async def registrations(ctx: Context, user_id: int) -> list[dict[str, object]]:
    """My registrations (of my live sessions)."""
    async with ctx.db.connect() as conn:
        rows = await store.of_user(conn, user_id, idle_cutoff(ctx.settings, now_ms()))
    return [
        {
            "app_id": r.app_id,
            "pushkey": r.pushkey,
            "platform": r.platform,
            "device_id": r.device_id,
            "data": r.data,
        }
        for r in rows
    ]


def push_config(ctx: Context) -> dict[str, object]:
    """What a browser passes to ``pushManager.subscribe``: the Web Push app id and VAPID
    public key, when both are configured."""
    s = ctx.settings
    if s.webpush_app_id and s.webpush_vapid_public_key:
        return {
            "webpush": {"app_id": s.webpush_app_id, "vapid_public_key": s.webpush_vapid_public_key}
        }
    return {}


async def prune_expired(ctx: Context, batch: int = 1000) -> int:
    """Delete the registrations of idle-expired sessions (never used meanwhile: every read
    skips them), a bounded batch per transaction until none is left; how many went."""
    total = 0
    while True:
        async with ctx.db.begin() as conn:
            n = await store.prune_expired(conn, idle_cutoff(ctx.settings, now_ms()), batch)
        total += n
        if n < batch:
            return total
