"""Sessions a user can manage: list them, revoke one device, log out everywhere, change
the password; one session per device; idle expiry; and the periodic re-check that closes
the sockets of a token revoked behind the server's back (no notice on the control
channel at all)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from im_server.client import ApiError, Client, Connection
from im_server.client.transport import HttpPool
from tests.support import PASSWORD, ServerProcess, Stores, eventually, new_user, pg

DAY_MS = 86_400_000


async def ws_refused(client: Client) -> None:
    try:
        conn: Connection = await client.connect()
    except ApiError as exc:
        assert exc.status in (401, 403), exc
        return
    assert await conn.wait_closed(timeout=5.0) == 4401


async def assert_dead(client: Client) -> None:
    with pytest.raises(ApiError) as e:
        await client.me()
    assert (e.value.status, e.value.code) == (401, "unauthorized")


async def login(url: str, c: Client, device_id: str | None = None) -> Client:
    return await Client.login(url, c.username or "", PASSWORD, device_id=device_id)


# -- list ---------------------------------------------------------------------------------------


async def test_sessions_lists_my_live_devices(url: str) -> None:
    t0 = int(time.time() * 1000)
    me = await new_user(url, "list")
    phone = await login(url, me, "phone")
    laptop = await login(url, me, "laptop")
    gone = await login(url, me, "gone")
    await gone.logout()
    try:
        rows = await phone.sessions()
        by_device = {r["device_id"]: r for r in rows}
        assert set(by_device) == {me.device_id, "phone", "laptop"}, rows
        assert len(rows) == 3
        for r in rows:
            assert set(r) == {"device_id", "label", "created_at", "last_used_at", "current"}, r
            assert isinstance(r["label"], str), r
            assert isinstance(r["created_at"], int) and isinstance(r["last_used_at"], int)
            assert t0 - 5000 <= r["created_at"] <= r["last_used_at"] <= t0 + 60_000, r
        assert [r["device_id"] for r in rows if r["current"]] == ["phone"]
        assert [r["device_id"] for r in await laptop.sessions() if r["current"]] == ["laptop"]
    finally:
        for c in (me, phone, laptop, gone):
            await c.aclose()


async def test_sessions_of_another_user_are_not_listed(url: str) -> None:
    a, b = await new_user(url, "a"), await new_user(url, "b")
    try:
        assert [r["device_id"] for r in await a.sessions()] == [a.device_id]
        assert [r["device_id"] for r in await b.sessions()] == [b.device_id]
    finally:
        await a.aclose()
        await b.aclose()


# -- one session per device ------------------------------------------------------------------


async def test_login_on_the_same_device_replaces_its_session(url: str) -> None:
    me = await new_user(url, "dev")
    first = await login(url, me, "tablet")
    conn = await first.connect()
    await conn.ping()
    second = await login(url, me, "tablet")
    try:
        assert first.token != second.token
        assert await conn.wait_closed(timeout=5.0) == 4401
        await assert_dead(first)
        await ws_refused(first)
        assert (await second.me())["user_id"] == me.user_id
        tablets = [r for r in await second.sessions() if r["device_id"] == "tablet"]
        assert len(tablets) == 1 and tablets[0]["current"] is True
        assert (await me.me())["user_id"] == me.user_id  # other devices untouched
    finally:
        for c in (me, first, second):
            await c.aclose()


async def test_replaced_session_closes_sockets_on_another_process(url: str, stores: Stores) -> None:
    me = await new_user(url, "devx")
    other = ServerProcess(env=stores.env()).start()
    first = await login(url, me, "watch")
    remote = Client(other.url, token=first.token)
    try:
        conn = await remote.connect()
        await conn.ping()
        second = await login(url, me, "watch")
        assert await conn.wait_closed(timeout=5.0) == 4401
        await assert_dead(remote)
        await second.aclose()
    finally:
        await remote.aclose()
        await first.aclose()
        await me.aclose()
        other.terminate()


# -- revoke one device ----------------------------------------------------------------------


async def test_revoke_a_device(url: str) -> None:
    me = await new_user(url, "rev")
    phone = await login(url, me, "phone")
    conn = await phone.connect()
    await conn.ping()
    mine = await me.connect()
    try:
        await me.revoke_session("phone")
        assert await conn.wait_closed(timeout=5.0) == 4401
        await assert_dead(phone)
        await ws_refused(phone)
        assert [r["device_id"] for r in await me.sessions()] == [me.device_id]
        await mine.ping()  # my own socket stays
        with pytest.raises(ApiError) as e:
            await me.revoke_session("phone")  # no live session there any more
        assert (e.value.status, e.value.code) == (404, "not_found")
        with pytest.raises(ApiError) as e:
            await me.revoke_session("never-seen")
        assert (e.value.status, e.value.code) == (404, "not_found")
        # my own device: the token asking is revoked too
        await me.revoke_session(me.device_id or "")
        assert await mine.wait_closed(timeout=5.0) == 4401
        await assert_dead(me)
    finally:
        await phone.aclose()
        await me.aclose()


@pytest.mark.parametrize(
    ("path", "statuses"),
    [
        ("/v1/sessions/" + "d" * 65, (400, 422)),
        ("/v1/sessions/" + "d" * 5000, (400, 422)),
        ("/v1/sessions/has%20space", (400, 422)),
        ("/v1/sessions/nul%00x", (400, 422)),
        ("/v1/sessions/%ED%A0%80", (400, 422)),  # an encoded surrogate
        ("/v1/sessions/%FF%FE", (400, 422)),  # not UTF-8
        ("/v1/sessions/%E5%BC%A0", (400, 422)),  # 张: not a device id character
        ("/v1/sessions/a%2Fb", (400, 404, 405, 422)),  # a/b: another path
    ],
)
async def test_revoke_device_path_is_validated(
    url: str, alice: Client, path: str, statuses: tuple[int, ...]
) -> None:
    async with HttpPool(timeout=30) as http:
        r = await http.delete(url + path, headers={"Authorization": f"Bearer {alice.token}"})
    assert r.status_code in statuses, (r.status_code, r.text[:200])
    assert r.json()["error"]["code"] in ("bad_request", "not_found"), r.text[:200]
    assert (await alice.me())["user_id"] == alice.user_id


async def test_device_named_current_is_refused_at_login(url: str) -> None:
    """``current`` names this session's own path (``DELETE /v1/sessions/current``): a
    device of that name could not be revoked from another device, so it is refused."""
    a = await new_user(url, "cur")
    try:
        for name in ("current",):
            with pytest.raises(ApiError) as e:
                await login(url, a, name)
            assert (e.value.status, e.value.code) == (400, "bad_request"), e.value
        assert [r["device_id"] for r in await a.sessions()] == [a.device_id]
        # a name that only looks like it is fine, and revocable from another device
        other = await login(url, a, "Current")
        await a.revoke_session("Current")
        with pytest.raises(ApiError) as e:
            await other.me()
        assert e.value.status == 401
        await other.aclose()
    finally:
        await a.aclose()


CHROME_WINDOWS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)


async def _login_raw(
    url: str, body: dict[str, object], ua: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {"User-Agent": ua} if ua is not None else {}
    pool = HttpPool()
    try:
        r = await pool.request("POST", url + "/v1/sessions", json=body, headers=headers)
        return r.status_code, r.json()
    finally:
        await pool.aclose()


async def test_sessions_are_labelled_by_name_or_browser(url: str) -> None:
    """A session's label is the ``device_name`` given at login, else the browser and
    platform of its User-Agent; a bad name is refused (400) and creates no session; a
    huge or unknown User-Agent is no error."""
    a = await new_user(url, "label")
    creds = {"username": a.username, "password": PASSWORD}
    try:
        st, _ = await _login_raw(url, {**creds, "device_id": "pc"}, CHROME_WINDOWS)
        assert st == 200
        named = {**creds, "device_id": "tab", "device_name": " My tablet "}
        st, _ = await _login_raw(url, named, CHROME_WINDOWS)
        assert st == 200
        st, _ = await _login_raw(url, {**creds, "device_id": "odd"}, "Mozilla/5.0 (" + "x" * 8_000)
        assert st == 200
        for bad in ("", "   ", "n" * 65, "tab\nlet", 5, "a\x00b"):
            st, ans = await _login_raw(url, {**creds, "device_id": "bad", "device_name": bad}, None)
            assert (st, ans["error"]["code"]) == (400, "bad_request"), (bad, st, ans)
        labels = {r["device_id"]: r["label"] for r in await a.sessions()}
        assert labels["pc"] == "Chrome on Windows", labels
        assert labels["tab"] == "My tablet", labels
        assert isinstance(labels["odd"], str) and len(labels["odd"]) <= 64
        assert "bad" not in labels
    finally:
        await a.aclose()


async def test_revoke_device_of_another_user_is_404(url: str) -> None:
    a, b = await new_user(url, "a"), await new_user(url, "b")
    b_phone = await login(url, b, "phone")
    try:
        with pytest.raises(ApiError) as e:
            await a.revoke_session("phone")
        assert (e.value.status, e.value.code) == (404, "not_found")
        with pytest.raises(ApiError) as e:
            await a.revoke_session(b.device_id or "")
        assert e.value.status == 404
        assert (await b_phone.me())["user_id"] == b.user_id
        assert (await b.me())["user_id"] == b.user_id
    finally:
        for c in (a, b, b_phone):
            await c.aclose()


# -- log out everywhere -------------------------------------------------------------------------


async def test_logout_everywhere(url: str) -> None:
    me = await new_user(url, "all")
    others = [await login(url, me, f"d{i}") for i in range(3)]
    conns = [await c.connect() for c in [me, *others]]
    for conn in conns:
        await conn.ping()
    try:
        await others[0].logout_everywhere()
        for conn in conns:
            assert await conn.wait_closed(timeout=5.0) == 4401
        for c in [me, *others]:
            await assert_dead(c)
        fresh = await login(url, me)
        assert [r["device_id"] for r in await fresh.sessions()] == [fresh.device_id]
        await fresh.aclose()
    finally:
        for c in [me, *others]:
            await c.aclose()


# -- password change ----------------------------------------------------------------------------


async def test_change_password_revokes_the_other_sessions(url: str) -> None:
    me = await new_user(url, "pw")
    other = await login(url, me, "other")
    conn = await other.connect()
    mine = await me.connect()
    await conn.ping()
    new_password = "new-" + uuid.uuid4().hex
    try:
        await me.change_password(PASSWORD, new_password)
        assert await conn.wait_closed(timeout=5.0) == 4401
        await assert_dead(other)
        await mine.ping()
        assert (await me.me())["user_id"] == me.user_id
        assert [r["device_id"] for r in await me.sessions()] == [me.device_id]
        with pytest.raises(ApiError) as e:
            await Client.login(url, me.username or "", PASSWORD)
        assert e.value.status == 401
        again = await Client.login(url, me.username or "", new_password)
        await again.aclose()
    finally:
        await me.aclose()
        await other.aclose()


async def test_change_password_refusals(url: str) -> None:
    me = await new_user(url, "pwbad")
    other = await login(url, me, "other")
    try:
        with pytest.raises(ApiError) as e:
            await me.change_password("wrong-password", "another-password")
        assert (e.value.status, e.value.code) == (401, "unauthorized")
        for body in (
            {"old_password": PASSWORD, "new_password": "short"},
            {"old_password": PASSWORD, "new_password": "p" * 257},
            {"old_password": PASSWORD, "new_password": 12345678},
            {"old_password": PASSWORD, "new_password": "bad\x00password"},
            {"old_password": PASSWORD},
            {"old_password": 5, "new_password": "another-password"},
            {"new_password": "another-password"},
        ):
            with pytest.raises(ApiError) as e:
                await me.request("PUT", "/v1/me/password", json=body)
            assert e.value.status in (400, 422), (body, e.value)
        # nothing changed: both sessions live, the old password still works
        assert (await other.me())["user_id"] == me.user_id
        again = await Client.login(url, me.username or "", PASSWORD)
        await again.aclose()
    finally:
        await me.aclose()
        await other.aclose()


# -- idle expiry on the shared server (default settings) ---------------------------------------


async def test_idle_token_is_refused(url: str, stores: Stores) -> None:
    me = await new_user(url, "idle")
    idle = await login(url, me, "idle-device")  # never used: not in any process cache
    try:
        async with pg(stores) as db:
            await db.execute(
                "UPDATE sessions SET last_used_at = last_used_at - $1 WHERE user_id = $2 "
                "AND device_id = 'idle-device'",
                31 * DAY_MS,
                me.user_id,
            )
        await assert_dead(idle)
        await ws_refused(idle)
        assert "idle-device" not in [r["device_id"] for r in await me.sessions()]
        with pytest.raises(ApiError) as e:
            await me.revoke_session("idle-device")
        assert e.value.status == 404
        assert (await me.me())["user_id"] == me.user_id
    finally:
        await me.aclose()
        await idle.aclose()


# -- a server with short intervals: idle expiry and the re-check of open sockets ----------------

IDLE_S = 3.0
SHORT = {
    "IM_SESSION_IDLE_DAYS": repr(IDLE_S / 86_400),
    "IM_TOKEN_RECHECK_SECONDS": "0.3",
    "IM_AUTH_CACHE_SECONDS": "0.1",
}


@pytest.fixture(scope="module")
def short(stores: Stores) -> Iterator[ServerProcess]:
    srv = ServerProcess(env={**stores.env(), **SHORT}).start()
    yield srv
    srv.terminate()


async def test_recheck_closes_a_socket_revoked_behind_the_servers_back(
    short: ServerProcess, stores: Stores
) -> None:
    """Revoked in PostgreSQL directly: no notice is published, only the re-check can see it."""
    me = await new_user(short.url, "recheck")
    keep = await login(short.url, me, "keep")
    try:
        conn = await me.connect()
        other = await keep.connect()
        await conn.ping()
        async with pg(stores) as db:
            await db.execute(
                "UPDATE sessions SET revoked_at = $1 WHERE user_id = $2 AND device_id = $3",
                int(time.time() * 1000),
                me.user_id,
                me.device_id,
            )
        assert await conn.wait_closed(timeout=10.0) == 4401
        assert conn.close_reason == "token revoked"
        await other.ping()  # the other device's socket is untouched
        await assert_dead(me)
    finally:
        await me.aclose()
        await keep.aclose()


async def test_idle_token_expires_on_rest(short: ServerProcess) -> None:
    """Used once, then left alone: it drops out of the list the other device (used all
    along) sees, and is refused on REST and WebSocket."""
    me = await new_user(short.url, "idlerest")
    watcher = await login(short.url, me, "watcher")
    try:
        assert (await me.me())["user_id"] == me.user_id

        async def gone() -> bool:
            return me.device_id not in [r["device_id"] for r in await watcher.sessions()]

        await eventually(gone, timeout=IDLE_S * 4, interval=0.2)
        await assert_dead(me)
        await ws_refused(me)
        assert (await watcher.me())["user_id"] == me.user_id
    finally:
        await me.aclose()
        await watcher.aclose()


async def test_a_used_token_stays_alive(short: ServerProcess) -> None:
    """Used every few hundred ms for twice the idle period: never refused."""
    me = await new_user(short.url, "used")
    try:
        deadline = time.monotonic() + 2 * IDLE_S
        calls = 0
        while time.monotonic() < deadline:
            assert (await me.me())["user_id"] == me.user_id
            calls += 1
            await asyncio.sleep(0.25)  # the pace of use, not a wait for a condition
        assert calls >= 8
    finally:
        await me.aclose()


async def test_an_open_socket_keeps_its_token_alive_until_it_idles(
    short: ServerProcess, stores: Stores
) -> None:
    """The re-check marks the tokens of open sockets as used: a socket outlives the idle
    period, and its token works on REST afterwards. A token whose ``last_used_at`` is
    moved back past the idle period is closed (4401) by the next re-check."""
    me = await new_user(short.url, "sock")
    try:
        conn = await me.connect()
        started = time.monotonic()
        while time.monotonic() - started < 2 * IDLE_S:
            await conn.ping()
            await asyncio.sleep(0.3)  # the pace of use
        assert not conn.closed.is_set()
        assert (await me.me())["user_id"] == me.user_id
        async with pg(stores) as db:
            await db.execute(
                "UPDATE sessions SET last_used_at = last_used_at - $1 WHERE user_id = $2",
                DAY_MS,
                me.user_id,
            )
        assert await conn.wait_closed(timeout=10.0) == 4401
        await assert_dead(me)
    finally:
        await me.aclose()
