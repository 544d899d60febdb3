"""Usernames are unique after NFKC and case folding, may be written in any script, and
are found by ``GET /v1/users/lookup``; names people see (display names, group names)
refuse invisible and bidi-control characters. The migration that introduced the key
keeps legacy users who collide under it able to log in."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from argon2 import PasswordHasher

from im_server.client import ApiError, Client
from im_server.client.transport import HttpPool, Response
from im_server.runtime.embedded import start_postgres, start_redis
from im_server.storage.db import ROOT
from tests.support import PASSWORD, ServerProcess


def tag() -> str:
    return uuid.uuid4().hex[:8]


def cjk(n: int) -> str:
    return "".join(chr(random.randint(0x4E00, 0x9FA5)) for _ in range(n))


async def register(url: str, body: dict[str, Any]) -> Response:
    async with HttpPool(timeout=30) as http:
        return await http.post(url + "/v1/users", json=body)


# -- uniqueness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Alice{}", "alice{}"),
        ("alice{}", "ALICE{}"),
        ("alice{}", "ａｌｉｃｅ{}"),  # full width
        ("ＡＬＩＣＥ{}", "alice{}"),
        ("strasse{}", "STRAßE{}"),
        ("jose\u0301{}", "José{}"),  # decomposed vs composed
    ],
)
async def test_usernames_collide_after_normalisation(url: str, first: str, second: str) -> None:
    t = tag()
    r1 = await register(url, {"username": first.format(t), "password": PASSWORD})
    assert r1.status_code == 201, r1.text
    r2 = await register(url, {"username": second.format(t), "password": PASSWORD})
    assert r2.status_code == 409 and r2.json()["error"]["code"] == "conflict", r2.text


async def test_fullwidth_name_is_stored_in_nfkc_form_and_logs_in_any_case(url: str) -> None:
    t = tag()
    r = await register(url, {"username": f"ＢＯＢ{t}", "password": PASSWORD})
    assert r.status_code == 201, r.text
    assert r.json()["username"] == f"BOB{t}"
    for spelling in (f"BOB{t}", f"bob{t}", f"ｂｏｂ{t}", f"ＢＯＢ{t}"):
        c = await Client.login(url, spelling, PASSWORD)
        assert c.user_id == r.json()["user_id"]
        assert (await c.me())["username"] == f"BOB{t}"
        await c.aclose()


async def test_chinese_usernames(url: str) -> None:
    name = cjk(2)
    c = await Client.register(url, name, PASSWORD)
    try:
        assert (await c.me())["username"] == name
        again = await Client.login(url, name, PASSWORD)
        assert again.user_id == c.user_id
        await again.aclose()
        longest = await Client.register(url, cjk(16), PASSWORD)
        await longest.aclose()
        for bad in (cjk(1), cjk(17)):  # a wide character counts as two: 2 and 34
            r = await register(url, {"username": bad, "password": PASSWORD})
            assert r.status_code in (400, 422), (bad, r.text)
    finally:
        await c.aclose()


@pytest.mark.parametrize(
    "username",
    [
        "zero\u200bwidth",
        "rtl\u202eeman",
        "hangul\u3164x",
        "\u3164\u3164\u3164",
        "join\u200dname",
        "emoji😀x",
        "spa ce",
        "\u0301abc",
    ],
)
async def test_invisible_characters_are_refused_in_usernames(url: str, username: str) -> None:
    r = await register(url, {"username": username + tag(), "password": PASSWORD})
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["code"] == "bad_request"


# -- display names and group names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("display_name", "ok"),
    [
        ("Alice Smith", True),
        ("张三", True),
        ("👩\u200d💻 coder", True),
        ("❤\ufe0f", True),
        ("🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", True),
        ("evil\u202etxt.exe", False),
        ("a\u2066b\u2069", False),
        ("lrm\u200e", False),
        ("\u3164", False),
        ("\u2800\u2800", False),
        ("\u115f\u1160", False),
        ("\uffa0", False),
        ("zw\u200bsp", False),
        ("   ", False),
        ("\u200d\ufe0f", False),
        ("tab\there", False),
    ],
)
async def test_display_name_rules(url: str, display_name: str, ok: bool) -> None:
    body = {"username": f"dn{tag()}", "password": PASSWORD, "display_name": display_name}
    r = await register(url, body)
    if ok:
        assert r.status_code == 201, r.text
        c = await Client.login(url, body["username"], PASSWORD)
        assert (await c.me())["display_name"] == display_name
        await c.aclose()
    else:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("Team 🚀", True),
        ("家族👨\u200d👩\u200d👧", True),
        ("team\u202e", False),
        ("\u3164\u3164", False),
        ("a\u200bb", False),
        ("\u2800", False),
    ],
)
async def test_group_name_rules(alice: Any, name: str, ok: bool) -> None:
    if ok:
        g = await alice.create_group(name, [])
        assert g["group_id"] > 0
    else:
        with pytest.raises(ApiError) as e:
            await alice.create_group(name, [])
        assert (e.value.status, e.value.code) == (400, "bad_request")


# -- look-up ------------------------------------------------------------------------------------


async def test_lookup_by_username(url: str, alice: Client) -> None:
    t = tag()
    other = await Client.register(url, f"Carol{t}", PASSWORD, display_name="Carol C")
    try:
        want = {
            "user_id": other.user_id,
            "username": f"Carol{t}",
            "display_name": "Carol C",
            "kind": "user",
        }
        for spelling in (f"Carol{t}", f"carol{t}", f"CAROL{t}", f"ｃａｒｏｌ{t}"):
            assert await alice.lookup_user(spelling) == want
        with pytest.raises(ApiError) as e:
            await alice.lookup_user(f"nobody{t}")
        assert (e.value.status, e.value.code) == (404, "not_found")
        with pytest.raises(ApiError) as e:
            await alice.lookup_user(f"Carol{t}x")  # no prefix match
        assert e.value.status == 404
        name = cjk(3)
        zh = await Client.register(url, name, PASSWORD)
        assert (await alice.lookup_user(name))["user_id"] == zh.user_id
        await zh.aclose()
    finally:
        await other.aclose()


@pytest.mark.parametrize(
    "query",
    [
        {"username": "x" * 300},
        {"username": "a\x00b"},
        {"username": "has space"},
        {"username": "ab"},
        {"username": ""},
        {},
    ],
)
async def test_lookup_bad_input_is_4xx(url: str, alice: Client, query: dict[str, str]) -> None:
    async with HttpPool(timeout=30) as http:
        r = await http.get(
            url + "/v1/users/lookup",
            params=query,
            headers={"Authorization": f"Bearer {alice.token}"},
        )
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["code"] == "bad_request"


async def test_lookup_needs_a_token(url: str, alice: Client) -> None:
    async with HttpPool(timeout=30) as http:
        r = await http.get(url + "/v1/users/lookup", params={"username": alice.username})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


# -- the migration on legacy rows ---------------------------------------------------------------


async def test_migration_keeps_colliding_legacy_users(tmp_path: Path) -> None:
    """Before keys, ``Alice`` and ``alice`` could both exist, and a device could hold two
    live sessions. After the migration both users log in with their exact username (the
    plain key belongs to the older), and only the newest of the duplicate sessions lives."""
    import asyncpg

    pgs = start_postgres(tmp_path / "pg", fsync=False)
    rds = start_redis(tmp_path / "redis")
    srv: ServerProcess | None = None
    try:
        cfg = Config(str(ROOT / "alembic.ini"))
        cfg.set_main_option("script_location", str(ROOT / "migrations"))
        cfg.set_main_option("sqlalchemy.url", pgs.url.replace("%", "%%"))
        await asyncio.to_thread(command.upgrade, cfg, "0002")  # Alembic runs its own loop
        dsn = pgs.url.replace("postgresql+asyncpg://", "postgresql://")
        ph = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
        db = await asyncpg.connect(dsn)
        try:
            ids = {}
            for name, pw in (("alice", "older-password"), ("Alice", "newer-password")):
                ids[name] = await db.fetchval(
                    "INSERT INTO users (username, display_name, password_hash, created_at) "
                    "VALUES ($1, $1, $2, 1) RETURNING user_id",
                    name,
                    ph.hash(pw),
                )
            for i, h in enumerate((b"\x01" * 32, b"\x02" * 32)):
                await db.execute(
                    "INSERT INTO sessions (token_hash, user_id, device_id, created_at) "
                    "VALUES ($1, $2, 'phone', $3)",
                    h,
                    ids["alice"],
                    1000 + i,
                )
        finally:
            await db.close()

        srv = ServerProcess(
            env={"IM_DATABASE_URL": pgs.url, "IM_REDIS_URL": rds.url}, data_dir=tmp_path
        ).start()
        older = await Client.login(srv.url, "alice", "older-password")
        newer = await Client.login(srv.url, "Alice", "newer-password")
        upper = await Client.login(srv.url, "ALICE", "older-password")
        assert (older.user_id, newer.user_id, upper.user_id) == (
            ids["alice"],
            ids["Alice"],
            ids["alice"],
        )
        assert (await older.lookup_user("ALICE"))["user_id"] == ids["alice"]
        assert (await older.lookup_user("Alice"))["user_id"] == ids["Alice"]
        r = await register(srv.url, {"username": "aLiCe", "password": PASSWORD})
        assert r.status_code == 409, r.text
        db = await asyncpg.connect(dsn)
        try:
            rows = await db.fetch(
                "SELECT token_hash, revoked_at IS NULL AS live, last_used_at, created_at "
                "FROM sessions WHERE user_id = $1 AND created_at < 2000 ORDER BY created_at",
                ids["alice"],
            )
            assert [bool(x["live"]) for x in rows] == [False, True]
            assert all(x["last_used_at"] == x["created_at"] for x in rows)
        finally:
            await db.close()
        for c in (older, newer, upper):
            await c.aclose()
    finally:
        if srv is not None:
            srv.terminate()
        rds.stop()
        pgs.stop()
