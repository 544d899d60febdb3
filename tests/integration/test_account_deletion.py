"""Account deletion (``DELETE /v1/me``): every token revoked and every socket closed
(4401), login refused, the username free again, ``GET /v1/users/{id}`` answers
``{user_id, deleted: true}``, friends no longer list me, every group left with the
normal notice and hand-over, push registrations gone, my messages kept for the others;
a wrong password or a bad body changes nothing; and a deletion whose server is killed
half-way is finished by the next server, once."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from im_server.client import ApiError, Client
from im_server.client.transport import HttpPool, TransportError
from im_server.protocol.ids import group_conv_id
from tests.support import (
    PASSWORD,
    Make,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    new_user,
    pg,
    pg_dsn,
    send_ok,
)

APP = "com.example.im.ios"


def apns_key() -> str:
    return secrets.token_hex(32)


async def assert_dead(c: Client) -> None:
    with pytest.raises(ApiError) as e:
        await c.me()
    assert (e.value.status, e.value.code) == (401, "unauthorized")


async def push_rows(stores: Stores, user_id: int) -> int:
    async with pg(stores) as db:
        n = await db.fetchval("SELECT count(*) FROM push_registrations WHERE user_id = $1", user_id)
    return int(n)


def roles(rows: list[dict[str, Any]]) -> dict[int, str]:
    return {int(r["user_id"]): str(r["role"]) for r in rows}


async def left_notices(c: Client, gid: int, user_id: int) -> list[dict[str, Any]]:
    page = await c.history(group_conv_id(gid), limit=100)
    return [
        m
        for m in page["messages"]
        if m["content_type"] == "system"
        and m["content"]["event"] == "member_left"
        and m["content"]["user_ids"] == [user_id]
    ]


async def test_deletion_does_the_whole_rule(make: Make, url: str, stores: Stores) -> None:
    me = await make("del")
    assert me.username and me.user_id
    friend, older, adm, m1, m2, other_owner = [
        await make(p) for p in ("fr", "old", "adm", "m1", "m2", "oo")
    ]
    conv = await befriend(me, friend)
    seq = await send_ok(me, conv, "remember me")
    # g1: an older plain member and a younger admin: the admin becomes owner
    g1 = (await me.create_group("g1", [older.user_id, adm.user_id]))["group_id"]
    await me.set_role(g1, adm.user_id, "admin")
    # g2: no admin: the oldest member becomes owner
    g2 = (await me.create_group("g2", [m2.user_id, m1.user_id]))["group_id"]
    # g3: I am a plain member
    g3 = (await other_owner.create_group("g3", [me.user_id]))["group_id"]
    asker, asked = await make("ask"), await make("asked")
    await asker.request_friend(me.user_id)
    await me.request_friend(asked.user_id)
    phone = await Client.login(url, me.username, PASSWORD, device_id="phone")
    await phone.register_push(APP, apns_key(), "apns")
    assert await push_rows(stores, me.user_id) == 1
    sock = await phone.connect()
    try:
        assert await me.delete_account(PASSWORD) is None  # 204

        assert await sock.wait_closed(timeout=5.0) == 4401
        await assert_dead(me)
        await assert_dead(phone)
        with pytest.raises(ApiError) as e:
            await Client.login(url, me.username, PASSWORD)
        assert e.value.status == 401
        # the username is free again
        again = await Client.register(url, me.username, PASSWORD)
        try:
            assert again.user_id != me.user_id
            assert (await friend.lookup_user(me.username))["user_id"] == again.user_id
        finally:
            await again.aclose()
        assert await friend.user(me.user_id) == {"user_id": me.user_id, "deleted": True}
        live = await friend.user(adm.user_id)
        assert set(live) == {"user_id", "username", "display_name", "kind"}, live
        assert me.user_id not in [f["user_id"] for f in await friend.friends()]
        assert await push_rows(stores, me.user_id) == 0
        async with pg(stores) as db:
            row = await db.fetchrow(
                "SELECT username, username_key, display_name, password_hash FROM users "
                "WHERE user_id = $1",
                me.user_id,
            )
        assert tuple(row) == (f"#deleted:{me.user_id}", f"#deleted:{me.user_id}", "", ""), row
        # sends to me are refused; the friend requests from and to me are gone
        with pytest.raises(ApiError) as e:
            await friend.send_rest(conv, "still there?")
        assert (e.value.status, e.value.code) == (403, "not_friends")
        assert (await asker.friend_requests())["outgoing"] == []
        assert (await asked.friend_requests())["incoming"] == []
        with pytest.raises(ApiError) as e:
            await asker.request_friend(me.user_id)
        assert e.value.status == 404

        # every group left, with hand-over and one member_left notice each
        assert roles(await older.members(g1)) == {older.user_id: "member", adm.user_id: "owner"}
        assert roles(await m1.members(g2)) == {m1.user_id: "owner", m2.user_id: "member"}
        assert roles(await other_owner.members(g3)) == {other_owner.user_id: "owner"}
        for c, gid in ((older, g1), (m1, g2), (other_owner, g3)):
            notices = await eventually(lambda c=c, gid=gid: left_notices(c, gid, me.user_id))
            assert len(notices) == 1, notices
            assert notices[0]["content"]["actor"] == me.user_id
        # my message stays in the other side's history, with my sender_id
        page = await friend.history(conv)
        mine = [m for m in page["messages"] if m["seq"] == seq]
        assert mine and mine[0]["sender_id"] == me.user_id, page
        # the group members list and the friends list still answer
        await friend.friends()
    finally:
        await phone.aclose()


async def test_wrong_password_changes_nothing(make: Make, url: str) -> None:
    me, friend = await make("wp"), await make("wpf")
    await befriend(me, friend)
    with pytest.raises(ApiError) as e:
        await me.delete_account("not-my-password")
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    assert (await me.me())["user_id"] == me.user_id
    assert me.user_id in [f["user_id"] for f in await friend.friends()]
    assert (await friend.user(me.user_id))["username"] == me.username
    c = await Client.login(url, me.username or "", PASSWORD)
    await c.aclose()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"password": 12345678},
        {"password": None},
        {"password": "x" * 257},
        {"password": "x" * 100_000},
        {"password": "bad\u0000nul-password"},
        {"pass": PASSWORD},
        [PASSWORD],
    ],
    ids=["missing", "int", "null", "long", "huge", "nul", "other-field", "list"],
)
async def test_bad_bodies_change_nothing(make: Make, url: str, body: Any) -> None:
    me = await make("bb")
    async with HttpPool() as http:
        r = await http.request(
            "DELETE", f"{url}/v1/me", json=body, headers={"Authorization": f"Bearer {me.token}"}
        )
    assert r.status_code in (400, 413, 422), r.text
    assert (await me.me())["user_id"] == me.user_id
    c = await Client.login(url, me.username or "", PASSWORD)
    await c.aclose()


async def test_deletion_killed_half_way_is_finished_by_the_next_server(
    stores: Stores, tmp_path: Path
) -> None:
    """The clean-up waits on a lock the test holds (LOCK TABLE conv_members IN SHARE
    MODE: the leave's update waits, its transaction open), the server is killed -9, the
    lock is let go, and a new server on the same stores finishes the deletion: each
    group left once, with hand-over; friends no longer list me; no push registration."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**stores.env(), "IM_DELETION_SWEEP_SECONDS": "0.5", "IM_TEST_LOG_DIR": str(logs)}
    srv = ServerProcess(env=env).start()
    srv2: ServerProcess | None = None
    clients: list[Client] = []
    try:
        me, friend, a, b = [await new_user(srv.url, p) for p in ("cr", "crf", "cra", "crb")]
        clients += [me, friend, a, b]
        assert me.user_id and me.username
        conv = await befriend(me, friend)
        g1 = (await me.create_group("c1", [a.user_id, b.user_id]))["group_id"]
        await me.set_role(g1, b.user_id, "admin")
        g2 = (await me.create_group("c2", [b.user_id, a.user_id]))["group_id"]
        await me.register_push(APP, apns_key(), "apns")

        db_lock = await _lock_conv_members(stores)
        try:
            deleting = asyncio.create_task(me.delete_account(PASSWORD))
            for _ in range(1000):
                waiting = await db_lock.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE relation = 'conv_members'::regclass "
                    "AND NOT granted"
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting, "the clean-up never waited on the lock"
            srv.kill9()
            with pytest.raises((ApiError, TransportError)):
                await deleting
            # killed half-way: the deletion is committed, its clean-up is not (checked
            # under the lock: no other process's sweep can finish it meanwhile)
            row = await db_lock.fetchrow(
                "SELECT deleted_at, cleaned_at FROM users WHERE user_id = $1", me.user_id
            )
            assert row["deleted_at"] is not None and row["cleaned_at"] is None, row
        finally:
            await db_lock.execute("ROLLBACK")
            await db_lock.close()

        srv2 = ServerProcess(env=env).start()
        for c in clients:
            c.base_url = srv2.url

        async def cleaned() -> bool:
            async with pg(stores) as db:
                v = await db.fetchval("SELECT cleaned_at FROM users WHERE user_id = $1", me.user_id)
            return v is not None

        await eventually(cleaned, timeout=15.0)
        await assert_dead(me)
        assert roles(await a.members(g1)) == {a.user_id: "member", b.user_id: "owner"}
        assert roles(await a.members(g2)) == {a.user_id: "owner", b.user_id: "member"}
        for gid in (g1, g2):
            notices = await eventually(lambda gid=gid: left_notices(a, gid, me.user_id))
            assert len(notices) == 1, notices
        assert me.user_id not in [f["user_id"] for f in await friend.friends()]
        with pytest.raises(ApiError) as e:
            await friend.send_rest(conv, "still there?")
        assert (e.value.status, e.value.code) == (403, "not_friends")
        assert await push_rows(stores, me.user_id) == 0
        assert await friend.user(me.user_id) == {"user_id": me.user_id, "deleted": True}
        # a later sweep changes nothing: still one notice per group
        await asyncio.sleep(1.5)
        for gid in (g1, g2):
            assert len(await left_notices(a, gid, me.user_id)) == 1
    finally:
        for c in clients:
            await c.aclose()
        srv.kill9()
        if srv2 is not None:
            srv2.terminate()


async def _lock_conv_members(stores: Stores) -> asyncpg.Connection:
    conn = await asyncpg.connect(pg_dsn(stores))
    await conn.execute("BEGIN")
    await conn.execute("LOCK TABLE conv_members IN SHARE MODE")
    return conn


# -- export --------------------------------------------------------------------------------


async def test_export_streams_my_data(make: Make, url: str) -> None:
    me, friend, other = await make("ex"), await make("exf"), await make("exo")
    conv = await befriend(me, friend)
    gid = (await other.create_group("exg", [me.user_id, friend.user_id]))["group_id"]
    gconv = group_conv_id(gid)
    await me.block(other.user_id)
    mine = [await send_ok(me, conv, f"single {i}") for i in range(3)]
    await send_ok(friend, conv, "not mine")
    mine_g = [await send_ok(me, gconv, f"group {i}") for i in range(2)]
    await send_ok(other, gconv, "not mine either")

    async def all_persisted() -> dict[str, Any] | None:
        data = await me.export()
        return data if len(data["messages"]) == 5 else None

    data = await eventually(all_persisted, timeout=15.0)
    assert data["user"] == {
        "user_id": me.user_id,
        "username": me.username,
        "display_name": me.username,
    }
    assert data["friends"] == [{"user_id": friend.user_id, "username": friend.username}]
    assert data["blocks"] == [other.user_id]
    assert data["groups"] == [{"group_id": gid, "name": "exg", "role": "member"}]
    got = sorted((m["conv_id"], m["seq"]) for m in data["messages"])
    assert got == sorted([(conv, s) for s in mine] + [(gconv, s) for s in mine_g])
    assert all(m["sender_id"] == me.user_id for m in data["messages"])
    texts = str([m["content"] for m in data["messages"]])
    assert "single 0" in texts and "group 1" in texts and "not mine" not in texts, texts
    async with HttpPool() as http:
        r = await http.get(f"{url}/v1/me/export")
    assert r.status_code == 401


async def test_export_of_many_messages_is_paged(make: Make) -> None:
    """More messages than a page: every one exactly once, in seq order per conversation."""
    from im_server.services import export

    me, friend = await make("exm"), await make("exmf")
    conv = await befriend(me, friend)
    n = export.PAGE + 7
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> int:
        async with sem:
            return await send_ok(me, conv, f"m{i}")

    seqs = await asyncio.gather(*(one(i) for i in range(n)))

    async def all_persisted() -> dict[str, Any] | None:
        data = await me.export()
        return data if len(data["messages"]) >= n else None

    data = await eventually(all_persisted, timeout=30.0, interval=0.5)
    got = [m["seq"] for m in data["messages"]]
    assert got == sorted(seqs), (len(got), n)
