"""Accounts and sessions: register, log in, /v1/me, bearer tokens on REST and WebSocket,
revocation, and what the stores keep (a password hash, a token hash)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import asyncpg
import pytest

from im_server.client import ApiError, Client, Connection
from im_server.client.transport import HttpPool, Response
from tests.support import PASSWORD, ServerProcess, Stores, new_user


def uname(prefix: str = "u") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def post(url: str, path: str, body: Any) -> Response:
    async with HttpPool(timeout=30.0) as http:
        return await http.post(url + path, json=body)


def assert_error(
    resp: Response, statuses: tuple[int, ...], code: str | None = None
) -> dict[str, Any]:
    assert resp.status_code in statuses, (resp.status_code, resp.text)
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert (
        isinstance(err, dict)
        and isinstance(err.get("code"), str)
        and isinstance(err.get("message"), str)
    ), body
    assert err["message"], body
    if code is not None:
        assert err["code"] == code, body
    return err


async def ws_refused(client: Client) -> None:
    """The contract allows two ways to refuse a socket: accept then close with 4401, or
    answer the upgrade 401/403."""
    try:
        conn: Connection = await client.connect()
    except ApiError as exc:
        assert exc.status in (401, 403), exc
        return
    assert await conn.wait_closed(timeout=5.0) == 4401


async def pg_connect(stores: Stores) -> asyncpg.Connection:
    return await asyncpg.connect(stores.pg.url.replace("+asyncpg", ""))


# -- register --------------------------------------------------------------------------------


async def test_register_returns_201(url: str) -> None:
    name = uname("reg")
    resp = await post(
        url, "/v1/users", {"username": name, "password": PASSWORD, "display_name": "Reg"}
    )
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["username"] == name
    assert isinstance(body["user_id"], int) and body["user_id"] > 0


async def test_register_duplicate_is_409(url: str) -> None:
    name = uname("dup")
    first = await post(url, "/v1/users", {"username": name, "password": PASSWORD})
    assert first.status_code == 201
    again = await post(url, "/v1/users", {"username": name, "password": "another-password"})
    assert_error(again, (409,), "conflict")


@pytest.mark.parametrize(
    "body",
    [
        {"username": "ab", "password": PASSWORD},  # too short
        {"username": "x" * 33, "password": PASSWORD},  # too long
        {"username": "has space", "password": PASSWORD},
        {"username": "slash/name", "password": PASSWORD},
        {"username": "", "password": PASSWORD},
        {"username": 12345, "password": PASSWORD},
        {"username": None, "password": PASSWORD},
        {"password": PASSWORD},
        {"username": "okname_{}", "password": "short"},
        {"username": "okname_{}", "password": ""},
        {"username": "okname_{}", "password": 12345678},
        {"username": "okname_{}"},
        {"username": "okname_{}", "password": "p" * 257},
    ],
)
async def test_register_validation(url: str, body: dict[str, Any]) -> None:
    body = {
        k: (v.format(uuid.uuid4().hex[:8]) if isinstance(v, str) and "{}" in v else v)
        for k, v in body.items()
    }
    resp = await post(url, "/v1/users", body)
    assert_error(resp, (400, 422))


async def test_register_not_json_is_4xx(url: str) -> None:
    async with HttpPool(timeout=30.0) as http:
        resp = await http.post(
            url + "/v1/users", content=b"not json", headers={"Content-Type": "application/json"}
        )
    assert_error(resp, (400, 422))


# -- login --------------------------------------------------------------------------------------


async def test_login_with_and_without_device_id(url: str) -> None:
    name = uname("login")
    reg = await post(url, "/v1/users", {"username": name, "password": PASSWORD})
    user_id = reg.json()["user_id"]

    resp = await post(
        url, "/v1/sessions", {"username": name, "password": PASSWORD, "device_id": "phone-1"}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["user_id"] == user_id and body["device_id"] == "phone-1"
    assert isinstance(body["token"], str) and len(body["token"]) >= 16

    resp2 = await post(url, "/v1/sessions", {"username": name, "password": PASSWORD})
    assert resp2.status_code == 200, resp2.text
    body2 = resp2.json()
    assert body2["user_id"] == user_id
    assert isinstance(body2["device_id"], str) and body2["device_id"]
    assert body2["token"] != body["token"]

    # both sessions are live at once
    async with HttpPool(timeout=30.0) as http:
        for token in (body["token"], body2["token"]):
            me = await http.get(url + "/v1/me", headers={"Authorization": f"Bearer {token}"})
            assert me.status_code == 200 and me.json()["user_id"] == user_id


@pytest.mark.parametrize(
    "body",
    [
        {"password": "wrong-password-1"},
        {"password": ""},
        {"username_suffix": "-nobody"},
    ],
)
async def test_login_bad_credentials_is_401(url: str, body: dict[str, Any]) -> None:
    name = uname("badlogin")
    await post(url, "/v1/users", {"username": name, "password": PASSWORD})
    req = {
        "username": name + body.get("username_suffix", ""),
        "password": body.get("password", PASSWORD),
    }
    resp = await post(url, "/v1/sessions", req)
    assert_error(resp, (401,), "unauthorized")


# -- /v1/me and bearer tokens -------------------------------------------------------------------


async def test_me(url: str) -> None:
    name = uname("me")
    client = await Client.register(url, name, PASSWORD, display_name="Me Myself")
    try:
        me = await client.me()
        assert me == {
            "user_id": client.user_id,
            "username": name,
            "display_name": "Me Myself",
            "kind": "user",
        }
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer garbage-token"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer " + "x" * 1000},
    ],
    ids=["missing", "empty", "garbage", "basic", "huge"],
)
async def test_me_without_valid_token_is_401(url: str, headers: dict[str, str]) -> None:
    async with HttpPool(timeout=30.0) as http:
        resp = await http.get(url + "/v1/me", headers=headers)
    assert_error(resp, (401,), "unauthorized")


async def test_token_works_on_a_second_process(url: str, stores: Stores) -> None:
    client = await new_user(url, "multi")
    other = ServerProcess(env=stores.env()).start()
    remote = Client(other.url, token=client.token)
    try:
        me = await remote.me()
        assert me["user_id"] == client.user_id
        conn = await remote.connect()
        await conn.ping()
        await conn.close()
    finally:
        await remote.aclose()
        await client.aclose()
        other.terminate()


# -- WebSocket auth ----------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "", "nope", "x" * 300])
async def test_ws_bad_token_refused(url: str, token: str | None) -> None:
    client = Client(url, token=token)
    try:
        await ws_refused(client)
    finally:
        await client.aclose()


async def test_ws_good_token_accepted(alice: Client) -> None:
    conn = await alice.connect()
    await conn.ping()
    assert not conn.closed.is_set()
    await conn.close()


# -- logout -------------------------------------------------------------------------------------


async def test_logout_revokes_token(url: str) -> None:
    client = await new_user(url, "logout")
    other_session = await Client.login(url, client.username or "", PASSWORD)
    open_conn = await client.connect()
    await open_conn.ping()
    try:
        token = client.token
        resp = await client.http.delete(
            url + "/v1/sessions/current", headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status_code == 204 and resp.content == b""

        # the socket that was open with it is closed with 4401
        assert await open_conn.wait_closed(timeout=5.0) == 4401

        with pytest.raises(ApiError) as exc:
            await client.me()
        assert exc.value.status == 401 and exc.value.code == "unauthorized"
        with pytest.raises(ApiError) as exc:
            await client.logout()
        assert exc.value.status == 401

        # a new socket with it is refused
        await ws_refused(client)

        # other sessions of the same user are untouched
        assert (await other_session.me())["user_id"] == client.user_id
    finally:
        await other_session.aclose()
        await client.aclose()


async def test_logout_is_seen_by_another_process(url: str, stores: Stores) -> None:
    client = await new_user(url, "revoke")
    other = ServerProcess(env=stores.env()).start()
    remote = Client(other.url, token=client.token)
    try:
        assert (await remote.me())["user_id"] == client.user_id  # now cached over there
        remote_conn = await remote.connect()
        await remote_conn.ping()
        await client.logout()
        assert await remote_conn.wait_closed(timeout=5.0) == 4401
        with pytest.raises(ApiError) as exc:
            await remote.me()
        assert exc.value.status == 401
    finally:
        await remote.aclose()
        await client.aclose()
        other.terminate()


# -- what the stores keep -----------------------------------------------------------------------


async def test_password_and_token_are_stored_hashed(url: str, stores: Stores) -> None:
    client = await new_user(url, "hash")
    pg = await pg_connect(stores)
    try:
        row = await pg.fetchrow(
            "SELECT password_hash FROM users WHERE user_id = $1", client.user_id
        )
        assert row is not None
        stored = row["password_hash"]
        assert stored != PASSWORD and PASSWORD not in stored
        assert stored.startswith("$argon2")

        hashes = [
            bytes(r["token_hash"])
            for r in await pg.fetch(
                "SELECT token_hash FROM sessions WHERE user_id = $1", client.user_id
            )
        ]
        token = client.token or ""
        assert hashes, "no session row"
        assert token.encode() not in hashes
        assert all(token.encode() not in h for h in hashes)
        assert hashlib.sha256(token.encode()).digest() in hashes
    finally:
        await pg.close()
        await client.aclose()
