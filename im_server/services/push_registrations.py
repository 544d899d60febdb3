"""Push registrations: a phone's push address tied to the session that registered it.

One per session (a PUT replaces it); it dies with the session (every revocation deletes
it in its own transaction, ``storage/accounts.py``; an idle-expired session's is never
used). An (app_id, pushkey) belongs to one session only: registering it again from
another session (the app re-installed, another account signed in on the phone) moves it
there, so a phone never receives another session's, nor another account's, pushes."""

from __future__ import annotations

import re

from sqlalchemy.exc import IntegrityError

from im_server.context import Context
from im_server.errors import ImError, bad_request
from im_server.services.accounts import idle_cutoff, token_hash
from im_server.storage import push as store
from im_server.storage.db import now_ms

PLATFORMS = ("apns", "fcm")
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
        raise bad_request("platform: 'apns' or 'fcm'")
    assert isinstance(platform, str)
    return app_id, pushkey, platform


async def do_register(
    ctx: Context, token: str, app_id: object, pushkey: object, platform: object
) -> None:
    """Tie the registration to the session of ``token``; ``conflict`` when I hold the
    limit already, ``unauthorized`` when the session ended meanwhile."""
    app, key, plat = check_registration(app_id, pushkey, platform)
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
        {"app_id": r.app_id, "pushkey": r.pushkey, "platform": r.platform, "device_id": r.device_id}
        for r in rows
    ]


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
