"""The server API (PROTOCOL.md "Your app's servers"): API keys, users by the app's own
ids, minted tokens, sends / groups / friendships for the app, Idempotency-Key, bots."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from im_server.client import ApiError, Client, ServerClient, single_conv_id
from im_server.client.transport import request_sync
from tests.support import ServerProcess, Stores, api_key, eventually, new_user, persisted, pg


def ext(prefix: str = "u") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def app(url: str, stores: Stores) -> Any:
    async with ServerClient(url, await api_key(stores)) as c:
        yield c


async def user_client(url: str, app: ServerClient, external_id: str, **kw: Any) -> Client:
    minted = await app.mint_token(external_id, **kw)
    c = Client(url, minted["token"], user_id=minted["user_id"])
    return c


# -- API keys ---------------------------------------------------------------------------------


def _cli(stores: Stores, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stores.env()}
    return subprocess.run(
        [sys.executable, "-m", "im_server", "apikey", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_apikey_cli_creates_lists_and_revokes(url: str, stores: Stores) -> None:
    name = f"cli{uuid.uuid4().hex[:8]}"
    made = _cli(stores, "create", "--name", name, "--scope", "users,messages")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("imk_") and len(key) > 40
    listed = _cli(stores, "list")
    assert name in listed.stdout and "scopes=messages,users" in listed.stdout
    assert key not in listed.stdout  # shown once only
    async with pg(stores) as conn:  # stored as a hash only
        rows = await conn.fetch("SELECT key_hash FROM api_keys WHERE name = $1", name)
        assert len(rows) == 1 and key.encode() not in bytes(rows[0]["key_hash"])
    async with ServerClient(url, key) as app:
        e = ext()
        await app.put_user(e)
        again = _cli(stores, "create", "--name", name, "--scope", "users")
        assert again.returncode == 2 and "live key" in again.stderr  # the name is taken
        bad = _cli(stores, "create", "--name", "x", "--scope", "users,everything")
        assert bad.returncode == 2 and "unknown scope" in bad.stderr
        assert _cli(stores, "revoke", name).returncode == 0
        assert _cli(stores, "revoke", name).returncode == 1

        async def refused() -> bool:
            try:
                await app.get_user(e)
            except ApiError as err:
                return err.status == 401
            return False

        await eventually(refused, timeout=10)
    assert name not in _cli(stores, "list").stdout


async def test_scopes_are_enforced(url: str, stores: Stores) -> None:
    async with (
        ServerClient(url, await api_key(stores, ["users"])) as users_only,
        ServerClient(url, await api_key(stores, ["messages"])) as messages_only,
    ):
        e = ext()
        await users_only.put_user(e)
        with pytest.raises(ApiError) as err:
            await messages_only.put_user(e)
        assert (err.value.status, err.value.code) == (403, "forbidden")
        with pytest.raises(ApiError) as err:
            await users_only.create_group("g", e)
        assert err.value.status == 403
        with pytest.raises(ApiError) as err:
            await users_only.send_message(e, "s:1:2", "m1", {"text": "x"})
        assert err.value.status == 403


async def test_keys_and_user_tokens_never_stand_for_each_other(
    url: str, app: ServerClient, alice: Client
) -> None:
    # a user token as the API key, the API key as a bearer token: both 401
    r = request_sync("GET", f"{url}/v1/server/users/x", headers={"X-Api-Key": alice.token or ""})
    assert r.status_code == 401
    r = request_sync(
        "GET", f"{url}/v1/server/users/x", headers={"Authorization": f"Bearer {alice.token}"}
    )
    assert r.status_code == 401
    r = request_sync("GET", f"{url}/v1/me", headers={"Authorization": f"Bearer {app.api_key}"})
    assert r.status_code == 401
    r = request_sync("GET", f"{url}/v1/me", headers={"X-Api-Key": app.api_key})
    assert r.status_code == 401


# -- users ------------------------------------------------------------------------------------


async def test_put_creates_then_updates_and_get_reads(app: ServerClient) -> None:
    e = ext()
    made = await app.put_user(e, display_name="Ann")
    assert made["created"] is True and made["external_id"] == e
    again = await app.put_user(e, display_name="Ann B.", kind="bot")
    assert again == {"user_id": made["user_id"], "external_id": e, "created": False}
    got = await app.get_user(e)
    assert got == {
        "user_id": made["user_id"],
        "external_id": e,
        "display_name": "Ann B.",
        "kind": "bot",
    }
    kept = await app.put_user(e)  # nothing given: nothing changes
    assert kept["created"] is False
    assert (await app.get_user(e))["display_name"] == "Ann B."
    # the external id keeps its case: another user
    upper = await app.put_user(e.upper())
    assert upper["created"] is True and upper["user_id"] != made["user_id"]


async def test_app_users_have_no_password_and_no_username_to_find(
    url: str, app: ServerClient
) -> None:
    e = ext()
    await app.put_user(e)
    for password in ("", "password-1234"):
        r = request_sync(
            "POST", f"{url}/v1/sessions", json={"username": f"@{e}", "password": password}
        )
        assert r.status_code in (400, 401, 422)
    c = await user_client(url, app, e)
    async with c:
        me = await c.request("GET", "/v1/me")
        assert me["username"] == f"@{e}" and me["display_name"] == e


@pytest.mark.parametrize(
    "bad",
    ["", "a" * 129, "has space", "semi;colon", "ünï", "a/b", "a%00b", "a%0Ab"],
)
async def test_bad_external_ids_are_refused(url: str, app: ServerClient, bad: str) -> None:
    r = request_sync(
        "PUT",
        f"{url}/v1/server/users/{bad}",
        json={},
        headers={"X-Api-Key": app.api_key},
    )
    assert r.status_code in (400, 404, 405, 422), r.text
    with pytest.raises(ApiError) as err:
        await app.import_users([{"external_id": bad or "", "display_name": "x"}])
    assert err.value.status in (400, 422)


async def test_hostile_bodies_change_nothing(url: str, app: ServerClient, stores: Stores) -> None:
    e = ext()
    bodies: list[Any] = [
        {"display_name": ""},
        {"display_name": "x" * 65},
        {"display_name": "\u202eevil"},
        {"display_name": 5},
        {"kind": "admin"},
        {"kind": ["bot"]},
        [],
        "text",
    ]
    for body in bodies:
        r = request_sync(
            "PUT", f"{url}/v1/server/users/{e}", json=body, headers={"X-Api-Key": app.api_key}
        )
        assert r.status_code in (400, 422), (body, r.text)
    with pytest.raises(ApiError) as err:
        await app.get_user(e)
    assert err.value.status == 404
    for body in (
        {"users": [{"external_id": e}, {"external_id": e}]},
        {"users": [{"external_id": e, "display_name": "\x07"}]},
        {"users": []},
        {"users": [{"external_id": f"x{i}"} for i in range(10_001)]},
        {"users": "all"},
    ):
        r = request_sync(
            "POST",
            f"{url}/v1/server/users/import",
            json=body,
            headers={"X-Api-Key": app.api_key},
            timeout=60,
        )
        assert r.status_code in (400, 413, 422), r.text[:200]
    with pytest.raises(ApiError):
        await app.get_user(e)
    for body in (
        {"ttl_s": 5},
        {"ttl_s": 1.5},
        {"ttl_s": "3600"},
        {"ttl_s": 2**62},
        {"device_id": "current"},
        {"device_id": "a b"},
    ):
        await app.put_user(e)
        with pytest.raises(ApiError) as err:
            await app.request("POST", f"/v1/server/users/{e}/tokens", json=body)
        assert err.value.status in (400, 422)


async def test_import_of_ten_thousand_in_one_transaction(app: ServerClient, stores: Stores) -> None:
    run = uuid.uuid4().hex[:8]
    users = [{"external_id": f"imp-{run}-{i}", "display_name": f"User {i}"} for i in range(10_000)]
    users[5]["kind"] = "bot"
    t0 = time.perf_counter()
    out = await app.import_users(users)
    took = time.perf_counter() - t0
    print(f"import of 10,000 users: {took:.2f} s")
    assert [u["external_id"] for u in out] == [u["external_id"] for u in users]
    assert len({u["user_id"] for u in out}) == 10_000
    # again, with some names changed: the same ids, nothing created
    users[0]["display_name"] = "Renamed"
    again = await app.import_users(users[:100] + [{"external_id": f"imp-{run}-new"}])
    assert [u["user_id"] for u in again[:100]] == [u["user_id"] for u in out[:100]]
    assert (await app.get_user(f"imp-{run}-0"))["display_name"] == "Renamed"
    assert (await app.get_user(f"imp-{run}-5"))["kind"] == "bot"
    # one bad row refuses the whole import: nothing of it is written
    bad = [{"external_id": f"imp-{run}-b{i}"} for i in range(50)] + [
        {"external_id": f"imp-{run}-b1"}
    ]
    with pytest.raises(ApiError):
        await app.import_users(bad)
    async with pg(stores) as conn:
        n = await conn.fetchval(
            "SELECT count(*) FROM users WHERE external_id LIKE $1", f"imp-{run}-b%"
        )
    assert n == 0


async def test_delete_is_the_account_deletion(url: str, app: ServerClient) -> None:
    e = ext()
    made = await app.put_user(e)
    c = await user_client(url, app, e)
    async with c:
        conn = await c.connect()
        await app.delete_user(e)
        assert await conn.wait_closed(10) == 4401
        with pytest.raises(ApiError) as err:
            await c.request("GET", "/v1/me")
        assert err.value.status == 401
    with pytest.raises(ApiError) as err:
        await app.get_user(e)
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        await app.delete_user(e)
    assert err.value.status == 404
    again = await app.put_user(e)  # the id may be used again: a new user
    assert again["created"] is True and again["user_id"] != made["user_id"]


# -- tokens -----------------------------------------------------------------------------------


async def test_minted_token_is_a_session(url: str, app: ServerClient, stores: Stores) -> None:
    e = ext()
    await app.put_user(e)
    minted = await app.mint_token(e, device_id="web", ttl_s=3600)
    assert minted["device_id"] == "web"
    assert abs(minted["expires_at"] - (time.time() * 1000 + 3_600_000)) < 60_000
    async with Client(url, minted["token"], user_id=minted["user_id"]) as c:
        sessions = await c.request("GET", "/v1/sessions")
        assert [s["device_id"] for s in sessions] == ["web"]
        conn = await c.connect()
        # minting again for the same device replaces the session, like a login
        await app.mint_token(e, device_id="web")
        assert await conn.wait_closed(10) == 4401
    # a minted token past its end is refused (set in the past before its first use)
    late = await app.mint_token(e, device_id="late", ttl_s=60)
    async with pg(stores) as db:
        await db.execute(
            "UPDATE sessions SET expires_at = 1 WHERE user_id = $1 AND device_id = 'late'",
            minted["user_id"],
        )
    r = request_sync("GET", f"{url}/v1/me", headers={"Authorization": f"Bearer {late['token']}"})
    assert r.status_code == 401
    with pytest.raises(ApiError) as err:
        await app.mint_token(ext())
    assert err.value.status == 404


async def test_revoke_tokens_ends_every_session_and_socket(url: str, app: ServerClient) -> None:
    e = ext()
    await app.put_user(e)
    a = await user_client(url, app, e, device_id="a")
    b = await user_client(url, app, e, device_id="b")
    async with a, b:
        ca, cb = await a.connect(), await b.connect()
        await app.revoke_tokens(e)
        assert await ca.wait_closed(10) == 4401
        assert await cb.wait_closed(10) == 4401
        for c in (a, b):
            with pytest.raises(ApiError) as err:
                await c.request("GET", "/v1/me")
            assert err.value.status == 401
    fresh = await user_client(url, app, e)  # a token minted after it works
    async with fresh:
        assert (await fresh.request("GET", "/v1/me"))["user_id"] == fresh.user_id


# -- acting for the app -----------------------------------------------------------------------


async def test_send_as_a_user_is_that_users_send(url: str, app: ServerClient) -> None:
    a, b = ext(), ext()
    await app.import_users([{"external_id": a}, {"external_id": b}])
    ca = await user_client(url, app, a)
    cb = await user_client(url, app, b)
    async with ca, cb:
        conv = single_conv_id(ca.user_id, cb.user_id)  # type: ignore[arg-type]
        with pytest.raises(ApiError) as err:  # not friends yet: the user's own rule
            await app.send_message(a, conv, "m1", {"text": "hi"})
        assert err.value.code == "not_friends"
        assert await app.befriend(a, b) == conv
        sock = await cb.connect()
        ack = await app.send_message(a, conv, "m1", {"text": "hi"})
        assert ack["ok"] is True and ack["seq"] >= 1 and ack["duplicate"] is False
        frame = await sock.next_event("message", timeout=10)
        assert frame["message"]["sender_id"] == ca.user_id
        assert frame["message"]["content"] == {"text": "hi"}
        dup = await app.send_message(a, conv, "m1", {"text": "hi"})
        assert dup["seq"] == ack["seq"] and dup["duplicate"] is True
        # the same client_msg_id from the user's own socket: the same send
        own = await ca.send_rest(conv, {"text": "hi"}, client_msg_id="m1")
        assert own["seq"] == ack["seq"]
        await cb.request("PUT", f"/v1/blocks/{ca.user_id}")
        with pytest.raises(ApiError) as err:
            await app.send_message(a, conv, "m2", {"text": "blocked"})
        assert err.value.code == "blocked"
        with pytest.raises(ApiError) as err:
            await app.send_message(ext(), conv, "m3", {"text": "who"})
        assert err.value.status == 404
        with pytest.raises(ApiError) as err:
            await app.send_message(a, "g:1:2", "m4", {"text": "bad conv"})
        assert err.value.status in (400, 422)
        await persisted(cb, conv, ack["seq"])


async def test_groups_for_the_app(url: str, app: ServerClient) -> None:
    o, m1, m2, late = ext(), ext(), ext(), ext()
    await app.import_users([{"external_id": x} for x in (o, m1, m2, late)])
    made = await app.create_group("team", o, [m1, m2, m1, o])
    gid, conv = made["group_id"], made["conv_id"]
    co = await user_client(url, app, o)
    cl = await user_client(url, app, late)
    async with co, cl:
        members = await co.request("GET", f"/v1/groups/{gid}/members")
        assert len(members) == 3
        assert {m["role"] for m in members if m["user_id"] == co.user_id} == {"owner"}
        await app.add_member(gid, late)
        await app.add_member(gid, late)  # already in: nothing changes
        page = await cl.request("GET", f"/v1/conversations/{conv}/messages")
        notices = [m for m in page["messages"] if m["content_type"] == "system"]
        assert len(notices) == 1  # joined without history: its own join notice only
        await app.remove_member(gid, late)
        await app.remove_member(gid, late)  # gone already: 204 again
        with pytest.raises(ApiError) as err:
            await cl.send_rest(conv, {"text": "after"})
        assert err.value.code == "not_member"
        await app.remove_member(gid, o)  # the owner leaves: ownership passes on
        left = await co.request("GET", f"/v1/conversations/{conv}/messages")
        assert left["messages"]
    with pytest.raises(ApiError) as err:
        await app.add_member(2**62, m1)
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        await app.create_group("g", o, [ext()])
    assert err.value.status == 404


async def test_idempotency_key_runs_a_write_once(app: ServerClient, stores: Stores) -> None:
    o = ext()
    await app.put_user(o)
    key = uuid.uuid4().hex
    first = await app.create_group("once", o, idempotency_key=key)
    again = await app.create_group("once", o, idempotency_key=key)
    assert again == first
    r = await app.http.request(
        "POST",
        app.base_url + "/v1/server/groups",
        json={"name": "once", "owner": o, "members": []},
        headers={"X-Api-Key": app.api_key, "Idempotency-Key": key},
    )
    assert r.status_code == 201 and r.headers.get("idempotent-replayed") == "true"
    with pytest.raises(ApiError) as err:  # the same key for another request
        await app.create_group("other", o, idempotency_key=key)
    assert err.value.code == "conflict"
    # at once, from many callers: one group
    key2 = uuid.uuid4().hex

    async def attempt() -> Any:
        try:
            return await app.create_group("race", o, idempotency_key=key2)
        except ApiError as e:
            return e.code

    results = await asyncio.gather(*(attempt() for _ in range(8)))
    made = [r for r in results if isinstance(r, dict)]
    assert made and all(r == made[0] for r in made)
    assert all(r == "conflict" for r in results if not isinstance(r, dict))
    async with pg(stores) as conn:
        n = await conn.fetchval(
            "SELECT count(*) FROM groups g JOIN conv_members m ON m.conv_id = 'g:' || g.group_id "
            "JOIN users u ON u.user_id = m.user_id WHERE u.external_id = $1 AND g.name = 'race'",
            o,
        )
    assert n == 1
    # a refusal is remembered too (the same call is refused the same way)
    key3 = uuid.uuid4().hex
    missing = ext()
    for _ in range(2):
        with pytest.raises(ApiError) as err:
            await app.create_group("x", missing, idempotency_key=key3)
        assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        await app.create_group("x", o, idempotency_key="bad key with spaces")
    assert err.value.status == 400


# -- bots -------------------------------------------------------------------------------------


async def test_anyone_may_open_a_chat_with_a_bot(url: str, app: ServerClient) -> None:
    bot = ext("bot")
    made = await app.put_user(bot, display_name="Helper", kind="bot")
    c = await new_user(url)
    other = await new_user(url)
    assert (await c.request("GET", f"/v1/users/{made['user_id']}"))["kind"] == "bot"
    assert (await c.request("GET", "/v1/me"))["kind"] == "user"
    conv = (await c.request("POST", f"/v1/bots/{made['user_id']}/chat"))["conv_id"]
    assert conv == single_conv_id(c.user_id, made["user_id"])  # type: ignore[arg-type]
    assert (await c.request("POST", f"/v1/bots/{made['user_id']}/chat"))["conv_id"] == conv
    # the bot listens on a socket with a minted token; the user writes, the bot answers
    bc = await user_client(url, app, bot, device_id="bot")
    async with bc:
        sock = await bc.connect()
        await c.send_rest(conv, {"text": "help"})
        got = await sock.next_event("message", timeout=10)
        assert got["message"]["content"] == {"text": "help"}
        ack = await app.send_message(bot, conv, "answer-1", {"text": "here"})
        assert ack["ok"] is True
        mine = await c.connect()
        sent = await sock.send(conv, {"text": "over ws"})
        ev = await mine.next_event("message", timeout=10)
        assert ev["message"]["seq"] == sent["seq"]
    with pytest.raises(ApiError) as err:  # not a bot: a friend request is needed
        await c.request("POST", f"/v1/bots/{other.user_id}/chat")
    assert err.value.status == 404
    with pytest.raises(ApiError) as err:
        await c.request("POST", f"/v1/bots/{2**62}/chat")
    assert err.value.status == 404
    # owners and admins may add a bot to their group
    g = await c.request("POST", "/v1/groups", json={"name": "g", "member_ids": [other.user_id]})
    await c.request(
        "POST",
        f"/v1/groups/{g['group_id']}/members",
        json={"user_ids": [made["user_id"]], "with_history": False},
    )
    with pytest.raises(ApiError) as err:  # a plain member may not
        await other.request(
            "POST",
            f"/v1/groups/{g['group_id']}/members",
            json={"user_ids": [made["user_id"]], "with_history": False},
        )
    assert err.value.status == 403


async def test_calls_are_logged_with_the_keys_name_never_the_key(
    server: ServerProcess, stores: Stores, url: str
) -> None:
    name = f"logged{uuid.uuid4().hex[:8]}"
    key = await api_key(stores, ["users"], name)
    async with ServerClient(url, key) as app:
        await app.put_user(ext())

        def logged() -> bool:
            assert server.log_path is not None
            text = open(server.log_path, errors="replace").read()
            assert key not in text and key[4:20] not in text
            return f"key {name!r}" in text

        await eventually(logged, timeout=10)


def test_apikey_cli_on_embedded_stores_not_running(tmp_path: Path) -> None:
    """With no database URL and no server on the data folder, the command starts the
    embedded PostgreSQL for itself, and stops it again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IM_")}
    data = tmp_path / "data"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "im_server", "apikey", "--data-dir", str(data), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    made = cli("create", "--name", "first", "--scope", "users")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().startswith("imk_")
    assert "first\tscopes=users" in cli("list").stdout
    from im_server.runtime.pg_running import running_url

    assert running_url(data / "pg") is None  # stopped at the command's end
