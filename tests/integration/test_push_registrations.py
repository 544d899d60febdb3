"""Push registrations (PROTOCOL.md, "Push notifications to phones"): one per session, mine
only, gone with the session (every way a session ends), a pushkey held by one session at
a time (the newest wins), bounded input and a per-user limit; and the storage calls the
pusher uses (``registrations_of``, ``delete_pushkeys``)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from im_server.client import ApiError, Client
from im_server.config import Settings
from im_server.storage import push as push_store
from im_server.storage.db import create_engine
from tests.support import PASSWORD, Stores, new_user, pg
from tests.support import pg_dsn as _pg_dsn

DAY_MS = 86_400_000
APP = "com.example.im.ios"


def apns_key() -> str:
    return secrets.token_hex(32)  # an APNs device token: 64 hex characters


def fcm_key() -> str:
    # the shape of an FCM registration token: ~160 characters of [A-Za-z0-9_:-]
    return secrets.token_urlsafe(16).replace("-", "_") + ":APA91b" + secrets.token_urlsafe(100)


async def login(url: str, c: Client, device_id: str | None = None) -> Client:
    return await Client.login(url, c.username or "", PASSWORD, device_id=device_id)


def reg(
    app_id: str,
    pushkey: str,
    platform: str,
    device_id: str | None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "app_id": app_id,
        "pushkey": pushkey,
        "platform": platform,
        "device_id": device_id,
        "data": data or {},
    }


async def rows_of_token(stores: Stores, user_id: int | None) -> list[tuple[str, str]]:
    """What PostgreSQL holds for the user: (device_id, pushkey), live session or not."""
    async with pg(stores) as db:
        rows = await db.fetch(
            "SELECT device_id, pushkey FROM push_registrations WHERE user_id = $1 "
            "ORDER BY device_id",
            user_id,
        )
    return [(r["device_id"], r["pushkey"]) for r in rows]


@pytest.fixture
async def engine(stores: Stores) -> AsyncIterator[AsyncEngine]:
    e = create_engine(Settings(database_url=_pg_dsn_async(stores), redis_url="redis://x"))
    yield e
    await e.dispose()


def _pg_dsn_async(stores: Stores) -> str:
    return _pg_dsn(stores).replace("postgresql://", "postgresql+asyncpg://", 1)


# -- PUT / GET / DELETE ---------------------------------------------------------------------


async def test_put_get_delete(url: str, stores: Stores) -> None:
    me = await new_user(url, "push")
    phone = await login(url, me, "phone")
    try:
        assert await me.push_registrations() == []
        key = apns_key()
        assert await phone.register_push(APP, key, "apns") is None  # 204
        want = [reg(APP, key, "apns", "phone")]
        assert await phone.push_registrations() == want
        assert await me.push_registrations() == want  # every session of mine sees it

        # a PUT replaces the session's registration
        key2 = fcm_key()
        await phone.register_push("com.example.im.android", key2, "fcm")
        assert await me.push_registrations() == [
            reg("com.example.im.android", key2, "fcm", "phone")
        ]
        # the same again: still one
        await phone.register_push("com.example.im.android", key2, "fcm")
        assert len(await me.push_registrations()) == 1

        # two sessions, two registrations
        key3 = apns_key()
        await me.register_push(APP, key3, "apns")
        got = await phone.push_registrations()
        assert sorted(r["pushkey"] for r in got) == sorted([key2, key3])

        # DELETE removes this session's only; again, and with none: 204 all the same
        assert await phone.unregister_push() is None
        assert await me.push_registrations() == [reg(APP, key3, "apns", me.device_id)]
        await phone.unregister_push()
        await me.unregister_push()
        await me.unregister_push()
        assert await me.push_registrations() == []
        assert await rows_of_token(stores, me.user_id) == []
    finally:
        await me.aclose()
        await phone.aclose()


async def test_others_never_see_mine(url: str) -> None:
    a, b = await new_user(url, "pusha"), await new_user(url, "pushb")
    try:
        await a.register_push(APP, apns_key(), "apns")
        assert await b.push_registrations() == []
        await b.unregister_push()  # B's DELETE touches B's session only
        assert len(await a.push_registrations()) == 1
    finally:
        await a.aclose()
        await b.aclose()


# -- every end of a session removes its registration ------------------------------------------


async def test_logout_removes_it(url: str, stores: Stores) -> None:
    me = await new_user(url, "pushout")
    phone = await login(url, me, "phone")
    try:
        await phone.register_push(APP, apns_key(), "apns")
        await me.register_push(APP, k := apns_key(), "apns")
        await phone.logout()
        assert await me.push_registrations() == [reg(APP, k, "apns", me.device_id)]
        assert await rows_of_token(stores, me.user_id) == [(me.device_id, k)]
    finally:
        await me.aclose()
        await phone.aclose()


async def test_revoke_from_another_device_removes_it(url: str, stores: Stores) -> None:
    me = await new_user(url, "pushrev")
    phone = await login(url, me, "phone")
    try:
        await phone.register_push(APP, apns_key(), "apns")
        await me.revoke_session("phone")
        assert await me.push_registrations() == []
        assert await rows_of_token(stores, me.user_id) == []
    finally:
        await me.aclose()
        await phone.aclose()


async def test_logout_everywhere_removes_all(url: str, stores: Stores) -> None:
    me = await new_user(url, "pushall")
    phone = await login(url, me, "phone")
    tablet = await login(url, me, "tablet")
    try:
        for c in (me, phone, tablet):
            await c.register_push(APP, apns_key(), "apns")
        await phone.logout_everywhere()
        assert await rows_of_token(stores, me.user_id) == []
        again = await login(url, me, "again")
        assert await again.push_registrations() == []
        await again.aclose()
    finally:
        for c in (me, phone, tablet):
            await c.aclose()


async def test_password_change_removes_the_others(url: str, stores: Stores) -> None:
    me = await new_user(url, "pushpw")
    phone = await login(url, me, "phone")
    try:
        await phone.register_push(APP, apns_key(), "apns")
        await me.register_push(APP, mine := apns_key(), "apns")
        await me.change_password(PASSWORD, PASSWORD + "-2")
        assert await me.push_registrations() == [reg(APP, mine, "apns", me.device_id)]
        assert await rows_of_token(stores, me.user_id) == [(me.device_id, mine)]
    finally:
        await me.aclose()
        await phone.aclose()


async def test_new_login_on_the_device_removes_it(url: str, stores: Stores) -> None:
    """A login on the same device replaces its session, and the old session's
    registration goes with it: the app registers again with its new token."""
    me = await new_user(url, "pushrelog")
    phone = await login(url, me, "phone")
    phone2: Client | None = None
    try:
        await phone.register_push(APP, apns_key(), "apns")
        phone2 = await login(url, me, "phone")
        assert await phone2.push_registrations() == []
        assert await rows_of_token(stores, me.user_id) == []
    finally:
        await me.aclose()
        await phone.aclose()
        if phone2 is not None:
            await phone2.aclose()


async def test_idle_expired_session_is_never_listed_nor_pushed(
    url: str, stores: Stores, engine: AsyncEngine
) -> None:
    me = await new_user(url, "pushidle")
    phone = await login(url, me, "phone")
    try:
        await phone.register_push(APP, apns_key(), "apns")
        await me.register_push(APP, mine := apns_key(), "apns")
        now = int(time.time() * 1000)
        async with pg(stores) as db:
            await db.execute(
                "UPDATE sessions SET last_used_at = $1, created_at = $1 "
                "WHERE user_id = $2 AND device_id = 'phone'",
                now - 31 * DAY_MS,
                me.user_id,
            )
        assert await me.push_registrations() == [reg(APP, mine, "apns", me.device_id)]
        cutoff = now - 30 * DAY_MS
        async with engine.connect() as conn:
            got = await push_store.registrations_of(conn, [me.user_id or 0], cutoff)
        assert [r.device_id for r in got[me.user_id or 0]] == [me.device_id]
        async with engine.begin() as conn:
            assert await push_store.prune_expired(conn, cutoff) >= 1
        assert await rows_of_token(stores, me.user_id) == [(me.device_id, mine)]
    finally:
        await me.aclose()
        await phone.aclose()


async def test_revocation_racing_a_put_never_leaves_a_row(url: str, stores: Stores) -> None:
    """A PUT and the session's revocation at the same moment: whichever commits first, no
    registration of a revoked session remains (the PUT waits for, or blocks, the
    revocation; the revocation's delete sees a PUT that committed while it waited)."""
    me = await new_user(url, "pushrace")
    try:
        for i in range(50):
            phone = await login(url, me, f"phone{i}")
            outcome = await asyncio.gather(
                phone.register_push(APP, apns_key(), "apns"),
                me.revoke_session(f"phone{i}"),
                return_exceptions=True,
            )
            put = outcome[0]
            assert put is None or (isinstance(put, ApiError) and put.status == 401), put
            assert outcome[1] is None, outcome[1]
            await phone.aclose()
        assert await rows_of_token(stores, me.user_id) == []
    finally:
        await me.aclose()


# -- a pushkey belongs to one session at a time ----------------------------------------------


async def test_pushkey_moves_to_the_newest_session(url: str, stores: Stores) -> None:
    """The same phone registered by another session of mine (the app re-installed with a
    new device id), then by another user signing in on that phone: the newest wins, the
    older registration is gone, so the phone never gets the other account's pushes."""
    me, other = await new_user(url, "pushmv"), await new_user(url, "pushmv2")
    reinstalled = await login(url, me, "reinstalled")
    try:
        key = apns_key()
        await me.register_push(APP, key, "apns")
        await reinstalled.register_push(APP, key, "apns")
        assert await me.push_registrations() == [reg(APP, key, "apns", "reinstalled")]

        await other.register_push(APP, key, "apns")
        assert await me.push_registrations() == []
        assert await other.push_registrations() == [reg(APP, key, "apns", other.device_id)]
        assert await rows_of_token(stores, me.user_id) == []

        # the same pushkey under another app id is another address: both kept
        await me.register_push("com.example.other", key, "apns")
        assert len(await me.push_registrations()) == 1
        assert len(await other.push_registrations()) == 1
    finally:
        for c in (me, other, reinstalled):
            await c.aclose()


async def test_same_pushkey_at_once_from_two_users_leaves_one(url: str, stores: Stores) -> None:
    users = await asyncio.gather(*(new_user(url, "pushsame") for _ in range(8)))
    try:
        for _ in range(10):
            key = apns_key()
            outcome = await asyncio.gather(
                *(u.register_push(APP, key, "apns") for u in users), return_exceptions=True
            )
            assert all(o is None for o in outcome), outcome
            async with pg(stores) as db:
                n = await db.fetchval(
                    "SELECT count(*) FROM push_registrations WHERE app_id = $1 AND pushkey = $2",
                    APP,
                    key,
                )
            assert n == 1
    finally:
        for u in users:
            await u.aclose()


# -- limits and bad input ---------------------------------------------------------------------


async def test_at_most_the_limit_per_user(url: str) -> None:
    """20 registrations (the default limit); the 21st session's PUT is 409 and changes
    nothing; replacing one of the 20 still works; after a DELETE there is room again."""
    me = await new_user(url, "pushmax")
    sessions = [me] + list(await asyncio.gather(*(login(url, me, f"d{i:02d}") for i in range(20))))
    try:
        for c in sessions[:20]:
            await c.register_push(APP, apns_key(), "apns")
        before = await me.push_registrations()
        assert len(before) == 20
        with pytest.raises(ApiError) as e:
            await sessions[20].register_push(APP, apns_key(), "apns")
        assert (e.value.status, e.value.code) == (409, "conflict")
        assert await me.push_registrations() == before
        await sessions[3].register_push(APP, apns_key(), "fcm")  # a replacement: allowed
        await sessions[3].unregister_push()
        await sessions[20].register_push(APP, apns_key(), "apns")
        assert len(await me.push_registrations()) == 20
    finally:
        for c in sessions:
            await c.aclose()


WEB = "com.example.im.web"
ENDPOINT = "https://push.example.net/send/abcDEF123"
AUTH = "k8JV6sjdbhAi-n3NdbKeKQ"
P256DH = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
WEB_DATA = {"endpoint": ENDPOINT, "auth": AUTH, "events_only": True}


async def test_webpush_registration(url: str) -> None:
    """A browser's subscription: the p256dh key as the pushkey, endpoint and auth (and the
    gateway's events_only) as data, listed back as given; GET /v1/push/config is {}
    without Web Push configured."""
    me = await new_user(url, "webpush")
    try:
        assert await me.push_config() == {}
        await me.register_push(WEB, P256DH, "webpush", WEB_DATA)
        assert await me.push_registrations() == [
            reg(WEB, P256DH, "webpush", me.device_id, WEB_DATA)
        ]
        # the same session moving to a phone's APNs token: its data goes with it
        await me.register_push(APP, apns_key(), "apns")
        [r] = await me.push_registrations()
        assert (r["platform"], r["data"]) == ("apns", {})
    finally:
        await me.aclose()


BAD_BODIES: list[tuple[Any, int]] = [
    ({"app_id": "", "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": "a" * 65, "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": "com.example/im", "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": "com example", "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": "com.exämple", "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "a" * 513, "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "ab cd", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "ab\ncd", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "ab\x00", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "é" * 10, "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": "ab", "platform": "gcm"}, 400),
    ({"app_id": APP, "pushkey": "ab", "platform": "APNS"}, 400),
    ({"app_id": APP, "pushkey": "ab", "platform": None}, 400),
    ({"app_id": 5, "pushkey": "ab", "platform": "apns"}, 400),
    ({"app_id": APP, "pushkey": ["ab"], "platform": "apns"}, 400),
    # Web Push: its subscription's endpoint and auth are required, for it alone
    ({"app_id": WEB, "pushkey": P256DH, "platform": "webpush"}, 400),
    ({"app_id": WEB, "pushkey": P256DH, "platform": "webpush", "data": {}}, 400),
    (
        {"app_id": WEB, "pushkey": P256DH, "platform": "webpush", "data": {"endpoint": ENDPOINT}},
        400,
    ),
    ({"app_id": WEB, "pushkey": P256DH, "platform": "webpush", "data": {"auth": AUTH}}, 400),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": "http://push.example/x", "auth": AUTH},
        },
        400,
    ),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": ENDPOINT + " x", "auth": AUTH},
        },
        400,
    ),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": ENDPOINT, "auth": "not base64!"},
        },
        400,
    ),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": ENDPOINT, "auth": AUTH, "url": "https://elsewhere"},
        },
        400,
    ),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": ENDPOINT, "auth": AUTH, "events_only": "yes"},
        },
        400,
    ),
    (
        {
            "app_id": WEB,
            "pushkey": P256DH,
            "platform": "webpush",
            "data": {"endpoint": ENDPOINT, "auth": AUTH, "default_payload": {"x": "y" * 1100}},
        },
        400,
    ),
    ({"app_id": APP, "pushkey": "ab", "platform": "apns", "data": {"auth": AUTH}}, 400),
    ({"app_id": APP, "pushkey": "ab", "platform": "fcm", "data": {}}, 400),
    ({"app_id": WEB, "pushkey": P256DH, "platform": "webpush", "data": [ENDPOINT]}, 400),
    ({"app_id": APP, "pushkey": "ab"}, 422),
    ({"pushkey": "ab", "platform": "apns"}, 422),
    ([APP], 422),
    ("x", 422),
]


@pytest.mark.parametrize(("body", "status"), BAD_BODIES)
async def test_bad_input_is_refused_and_changes_nothing(url: str, body: Any, status: int) -> None:
    me = await new_user(url, "pushbad")
    try:
        await me.register_push(APP, key := apns_key(), "apns")
        with pytest.raises(ApiError) as e:
            await me.request("PUT", "/v1/push/registration", json=body)
        assert e.value.status == status, e.value
        if status == 400:
            assert e.value.code == "bad_request"
            assert e.value.message, "a clear message"
        assert await me.push_registrations() == [reg(APP, key, "apns", me.device_id)]
    finally:
        await me.aclose()


async def test_bounds_are_inclusive(url: str) -> None:
    me = await new_user(url, "pushbound")
    try:
        await me.register_push("a" * 64, "~" * 512, "fcm")
        await me.register_push("a", "!", "apns")
        await me.register_push(APP, fcm_key(), "fcm")
        assert len(await me.push_registrations()) == 1
    finally:
        await me.aclose()


# -- the storage calls of the pusher ----------------------------------------------------------


async def test_registrations_of_and_delete_pushkeys(url: str, engine: AsyncEngine) -> None:
    a, b, c = await asyncio.gather(*(new_user(url, "pushst") for _ in range(3)))
    a2 = await login(url, a, "second")
    try:
        ka, ka2, kb = apns_key(), fcm_key(), apns_key()
        await a.register_push(APP, ka, "apns")
        await a2.register_push("com.example.im.android", ka2, "fcm")
        await b.register_push(APP, kb, "apns")
        ua, ub, uc = (int(x.user_id or 0) for x in (a, b, c))
        async with engine.connect() as conn:
            got = await push_store.registrations_of(conn, [ua, ub, uc, ua])
            assert await push_store.registrations_of(conn, []) == {}
        assert set(got) == {ua, ub}  # c has none: absent
        assert sorted(got[ua], key=lambda r: r.device_id) == sorted(
            [
                push_store.Registration(APP, ka, "apns", a.device_id or ""),
                push_store.Registration("com.example.im.android", ka2, "fcm", "second"),
            ],
            key=lambda r: r.device_id,
        )
        assert got[ub] == [push_store.Registration(APP, kb, "apns", b.device_id or "")]

        # rejected keys: the pairs named go, the same key under another app id stays
        async with engine.begin() as conn:
            n = await push_store.delete_pushkeys(
                conn, [(APP, ka), ("com.example.im.android", kb), (APP, "unknown")]
            )
        assert n == 1
        async with engine.connect() as conn:
            got = await push_store.registrations_of(conn, [ua, ub])
        assert [r.pushkey for r in got[ua]] == [ka2]
        assert [r.pushkey for r in got[ub]] == [kb]
        async with engine.begin() as conn:
            assert await push_store.delete_pushkeys(conn, []) == 0
    finally:
        for x in (a, b, c, a2):
            await x.aclose()


async def test_registrations_of_is_one_statement(url: str, engine: AsyncEngine) -> None:
    from sqlalchemy import event

    users = await asyncio.gather(*(new_user(url, "push1st") for _ in range(5)))
    try:
        for u in users:
            await u.register_push(APP, apns_key(), "apns")
        statements: list[str] = []

        def count(*args: Any) -> None:
            statements.append(str(args[2]))

        event.listen(engine.sync_engine, "before_cursor_execute", count)
        try:
            async with engine.connect() as conn:
                got = await push_store.registrations_of(conn, [int(u.user_id or 0) for u in users])
        finally:
            event.remove(engine.sync_engine, "before_cursor_execute", count)
        assert len(got) == 5
        assert len([s for s in statements if "push_registrations" in s]) == 1, statements
    finally:
        for u in users:
            await u.aclose()
