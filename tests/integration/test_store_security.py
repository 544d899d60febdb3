"""The embedded PostgreSQL and Valkey accept only those who know their passwords, listen on
127.0.0.1 only, and keep their files private; folders of older versions (PostgreSQL with
trust authentication, Redis 6.2 without a password) are taken over."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest
import redis

from im_server.client.transport import request_sync
from im_server.runtime.aof_repair import AOF_DIR, AOF_FILE, AOF_MANIFEST
from im_server.runtime.embedded import (
    PASSWORD_FILE,
    STORE_SYSTEM_USER,
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedRuntimeError,
    free_port,
    prepare_data_dir,
    read_password,
    start_postgres,
    start_redis,
    store_user,
)
from im_server.runtime.ownership import open_prefix, pg_install
from im_server.runtime.pg_init import AUTH_MARKER
from im_server.runtime.postgres import _pg_socket_dir
from im_server.runtime.processes import run
from tests.support import ServerProcess, Stores, raw_redis, start_redis_62, wait_aof_rewrite

# --------------------------------------------------------------------------- helpers


def owner_uid() -> int:
    """Who must own the data folder: the store system user as root, else ourselves."""
    if os.geteuid() == 0:
        return pwd.getpwnam(STORE_SYSTEM_USER).pw_uid
    return os.geteuid()


def tree(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """``root`` and every folder and regular file below it (sockets and links left out)."""
    yield root, root.lstat()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):  # a server may remove a temp file
                st = p.lstat()
                if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                    yield p, st


def assert_private(root: Path) -> None:
    """Nothing under ``root`` is open to group or others, and all of it is the store
    user's (root: the system user; otherwise: us)."""
    uid = owner_uid()
    open_ = [str(p) for p, st in tree(root) if stat.S_IMODE(st.st_mode) & 0o077]
    assert not open_, f"open to group/others: {open_[:10]}"
    foreign = [str(p) for p, st in tree(root) if st.st_uid != uid]
    assert not foreign, f"not owned by uid {uid}: {foreign[:10]}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def pg_connect(
    pg: EmbeddedPostgres, password: str | None = None, host: str = "127.0.0.1"
) -> list[asyncpg.Record]:
    """``select 1`` through a fresh connection with the given credentials."""

    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(
            host=host, port=pg.port, user="postgres", password=password, database="postgres"
        )
        try:
            return list(await conn.fetch("select 1 as one"))
        finally:
            await conn.close()

    return asyncio.run(go())


def pg_sql(pg: EmbeddedPostgres, sql: str, *args: object) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(pg.url.replace("+asyncpg", ""))
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    s = Stores.start(tmp_path_factory.mktemp("secure") / "data")
    yield s
    s.stop()


# --------------------------------------------------------------------------- access


def test_postgres_wants_the_password(stores: Stores) -> None:
    pg = stores.pg
    password = read_password(pg.data_dir)
    assert password == pg.password and len(password) >= 40
    with pytest.raises(asyncpg.InvalidPasswordError):
        pg_connect(pg)
    with pytest.raises(asyncpg.InvalidPasswordError):
        pg_connect(pg, password="not-" + password)
    # the unix socket wants it too
    assert pg.socket_dir is not None
    with pytest.raises(asyncpg.InvalidPasswordError):
        pg_connect(pg, host=str(pg.socket_dir))
    assert pg_connect(pg, password=password)[0]["one"] == 1
    assert pg_connect(pg, host=str(pg.socket_dir), password=password)[0]["one"] == 1
    rules = pg_sql(pg, "select type, auth_method, address, error from pg_hba_file_rules")
    assert {(r["type"], r["auth_method"], r["address"]) for r in rules} == {
        ("local", "scram-sha-256", None),
        ("host", "scram-sha-256", "127.0.0.1"),
    }
    assert all(r["error"] is None for r in rules)
    assert pg_sql(pg, "show listen_addresses")[0][0] == "127.0.0.1"


def test_redis_wants_the_password_and_has_no_admin_commands(stores: Stores) -> None:
    rd = stores.redis
    password = read_password(rd.data_dir)
    assert password == rd.password and len(password) >= 40
    assert raw_redis(rd.port, "PUBLISH im:user:1 forged", "GET k")[0].startswith(b"-NOAUTH")
    assert raw_redis(rd.port, "AUTH not-" + password)[0].startswith(b"-WRONGPASS")
    replies = raw_redis(
        rd.port,
        f"AUTH {password}",
        "CONFIG SET dir /tmp",
        "CONFIG GET requirepass",
        "CONFIG SET enable-protected-configs yes",
        "REPLICAOF 127.0.0.1 1",
        "SLAVEOF 127.0.0.1 1",
        "DEBUG SLEEP 0",
        "DEBUG SET-ACTIVE-EXPIRE 0",
        "MODULE LOAD /tmp/m.so",
        "MODULE LOADEX /tmp/m.so",
        "MODULE UNLOAD lua",
        "PUBLISH im:user:1 hello",
    )
    assert replies[0] == b"+OK"
    # renamed away: as if they did not exist
    assert all(r.startswith(b"-ERR unknown command") for r in replies[1:6]), replies
    # switched off by enable-debug-command / enable-module-command no
    assert all(r.startswith(b"-ERR DEBUG command not allowed") for r in replies[6:8]), replies
    assert all(r.startswith(b"-ERR MODULE command not allowed") for r in replies[8:11]), replies
    assert replies[11] == b":0"
    c = redis.Redis.from_url(rd.url)
    try:
        c.set("k", "v")
        assert c.get("k") == b"v"
        info = c.info("server")
        assert info["server_name"] == "valkey" and info["valkey_version"].startswith("9.")
        assert c.flushall() is True
        assert c.dbsize() == 0
    finally:
        c.close()
    conf = (rd.data_dir / "redis.conf").read_text()
    assert "bind 127.0.0.1\n" in conf and "protected-mode yes\n" in conf
    assert "enable-debug-command no\n" in conf and "enable-module-command no\n" in conf


def test_loopback_only(stores: Stores) -> None:
    """Both listen on 127.0.0.1 and nothing else; the host's other addresses refuse."""
    pids = {"postgres": stores.pg.pid(), "redis": stores.redis.pid()}
    ports = {"postgres": stores.pg.port, "redis": stores.redis.port}
    for what, pid in pids.items():
        assert pid is not None
        listening = [
            c.laddr
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), (what, listening)
        assert all(a.port == ports[what] for a in listening)
    others = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
        and not a.address.startswith("127.")
        and a.address != "::1"
    ]
    for address in others:
        for port in ports.values():
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass


def test_files_are_private(stores: Stores) -> None:
    root = stores.root
    c = redis.Redis.from_url(stores.redis.url)
    try:
        c.set("written", "1")  # the AOF has data in it
    finally:
        c.close()
    assert mode(root) == 0o700
    for store in (stores.pg.data_dir, stores.redis.data_dir):
        assert mode(store) == 0o700
        assert mode(store / PASSWORD_FILE) == 0o600
    aof_dir = stores.redis.data_dir / AOF_DIR
    aof_files = [f.name for f in aof_dir.iterdir()]
    assert AOF_MANIFEST in aof_files and len(aof_files) >= 3, aof_files  # base, increment
    assert mode(aof_dir) == 0o700
    for f in (
        *aof_dir.iterdir(),
        stores.redis.data_dir / "redis.log",
        stores.redis.data_dir / "redis.conf",
        stores.pg.data_dir / "postgres.log",
        stores.pg.data_dir / "pg_hba.conf",
    ):
        assert f.exists() and mode(f) & 0o077 == 0, f
    assert_private(root)


def test_store_processes_run_unprivileged_and_hide_their_passwords(stores: Stores) -> None:
    uid = owner_uid()
    secrets = (stores.pg.password, stores.redis.password)
    for pid in (stores.pg.pid(), stores.redis.pid()):
        assert pid is not None
        p = psutil.Process(pid)
        assert p.uids().real == uid and p.uids().effective == uid
        assert not any(s in " ".join(p.cmdline()) for s in secrets)
    # nobody's command line holds a password (it is readable by every user)
    for p in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or ())
        assert not any(s in cmdline for s in secrets), p.pid


# --------------------------------------------------------------------------- im-server serve


def test_serve_prints_and_logs_no_password(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"IM_DATABASE_URL": "", "IM_REDIS_URL": "", "IM_TEST_LOG_DIR": str(tmp_path)}
    srv = ServerProcess(env=env, data_dir=data).start(timeout=120)
    try:
        assert request_sync("GET", srv.url + "/readyz", timeout=5).status_code == 200
        secrets = (read_password(data / "pg"), read_password(data / "redis"))
    finally:
        srv.terminate()
    assert srv.log_path is not None
    text = srv.log_path.read_text(errors="replace")
    assert "embedded PostgreSQL postgresql+asyncpg://postgres:***@127.0.0.1:" in text
    assert "Redis redis://:***@127.0.0.1:" in text
    assert "Valkey redis://:***@127.0.0.1:" in text  # the embedded server, in the start-up line
    assert "valkey: clean start; started pid" in text
    for secret in secrets:
        assert secret not in text
        for log in (data / "pg" / "postgres.log", data / "redis" / "redis.log"):
            assert secret not in log.read_text(errors="replace")
    assert_private(data)


# --------------------------------------------------------------------------- passwords


def test_password_rotation_and_interrupted_password_step(tmp_path: Path) -> None:
    root = prepare_data_dir(tmp_path / "data")
    pg = start_postgres(root / "pg", fsync=False)
    rd = start_redis(root / "redis")
    try:
        old_pg, old_rd = pg.password, rd.password
        pg.stop()
        rd.stop()
        # The password files are edited: a restart applies the new passwords.
        (root / "pg" / PASSWORD_FILE).write_text("the-new-postgres-password-0123\n")
        (root / "redis" / PASSWORD_FILE).write_text("the-new-redis-password-0123\n")
        pg = start_postgres(root / "pg", fsync=False)
        rd = start_redis(root / "redis")
        assert pg.password == "the-new-postgres-password-0123"
        assert rd.password == "the-new-redis-password-0123"
        with pytest.raises(asyncpg.InvalidPasswordError):
            pg_connect(pg, password=old_pg)
        assert pg_connect(pg, password=pg.password)[0]["one"] == 1
        assert raw_redis(rd.port, f"AUTH {old_rd}")[0].startswith(b"-WRONGPASS")
        assert raw_redis(rd.port, f"AUTH {rd.password}", "PING") == [b"+OK", b"+PONG"]
        # A crash between setting the password and writing the marker, and a trust
        # pg_hba.conf put back by hand: the next start redoes both.
        pg.stop()
        (root / "pg" / AUTH_MARKER).unlink()
        (root / "pg" / "pg_hba.conf").write_text("host all all 127.0.0.1/32 trust\n")
        pg = start_postgres(root / "pg", fsync=False)
        with pytest.raises(asyncpg.InvalidPasswordError):
            pg_connect(pg)
        assert pg_connect(pg, password=pg.password)[0]["one"] == 1
        assert (root / "pg" / AUTH_MARKER).exists()
        assert_private(root)
    finally:
        rd.stop()
        pg.stop()


def test_a_bad_password_file_is_refused_without_showing_it(tmp_path: Path) -> None:
    root = prepare_data_dir(tmp_path / "data")
    (root / "redis").mkdir(mode=0o700)
    bad = "has spaces and 'quotes' in it"
    (root / "redis" / PASSWORD_FILE).write_text(bad + "\n")
    with pytest.raises(EmbeddedRuntimeError, match="does not hold a usable password") as e:
        start_redis(root / "redis")
    assert bad not in str(e.value)
    # emptied, it gets a new random password
    (root / "redis" / PASSWORD_FILE).write_text("")
    rd = start_redis(root / "redis")
    try:
        assert len(rd.password) >= 40 and read_password(root / "redis") == rd.password
    finally:
        rd.stop()


def test_a_squatted_socket_folder_is_refused(tmp_path: Path) -> None:
    """A PGDATA too deep for the socket puts it in a temp folder; a symlink (or anybody
    else's folder) there is not used."""
    pgdata = prepare_data_dir(tmp_path / ("d" * 80)) / "pg"
    sock_dir = _pg_socket_dir(pgdata)
    assert sock_dir != pgdata
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    before = target.stat()
    sock_dir.symlink_to(target)
    try:
        with pytest.raises(EmbeddedRuntimeError, match="socket dir"):
            start_postgres(pgdata, fsync=False)
        after = target.stat()
        assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)
        assert not any(target.iterdir())
    finally:
        sock_dir.unlink()


# --------------------------------------------------------------------------- upgrade


def _old_style_folder(root: Path) -> None:
    """A data folder as the previous version left it: 0755, PGDATA made with trust
    authentication (owned by the store user as root), Redis 6.2 run as us without a
    password and with umask 022 (so a 0644 AOF and log), one row and a few keys in them,
    the AOF rewritten once (an RDB snapshot, then commands)."""
    user = store_user()
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    pgdata, rdir = root / "pg", root / "redis"
    pgdata.mkdir(mode=0o700)
    if user.uid is not None and user.gid is not None:
        os.chown(pgdata, user.uid, user.gid)
        open_prefix(pgdata)
    bin_ = pg_install() / "bin"
    kw = {"cwd": str(pgdata), **user.run_kwargs()}
    run(
        [str(bin_ / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "--no-sync"]
        + ["--encoding=UTF8", "--no-locale"],
        what="initdb",
        timeout=120,
        **kw,
    )
    pg_port = free_port()
    opts = f"-p {pg_port} -k {pgdata} -c listen_addresses=127.0.0.1 -c fsync=off"
    log = str(pgdata / "postgres.log")
    run(
        [str(bin_ / "pg_ctl"), "start", "-D", str(pgdata), "-w", "-l", log, "-o", opts],
        what="pg_ctl start",
        timeout=60,
        start_new_session=True,
        **kw,
    )
    try:
        old = EmbeddedPostgres(data_dir=pgdata, port=pg_port, url="")

        async def write() -> None:
            conn = await asyncpg.connect(host="127.0.0.1", port=pg_port, user="postgres")
            try:
                await conn.execute("create table kept (v text); insert into kept values ('row')")
            finally:
                await conn.close()

        asyncio.run(write())
    finally:
        run(
            [str(bin_ / "pg_ctl"), "stop", "-D", str(pgdata), "-m", "fast", "-w"],
            what="pg_ctl stop",
            timeout=60,
            **kw,
        )
    assert old.pid() is None

    rdir.mkdir(mode=0o755)
    rdir.chmod(0o755)
    server, r_port = start_redis_62(rdir)
    try:
        c = redis.Redis(port=r_port, socket_timeout=5)
        assert c.info("server")["redis_version"].startswith("6.2.")
        c.set("kept", "key")
        c.hset("kept-hash", mapping={"f": "v"})
        c.xadd("kept-stream", {"f": "1"}, id="1-1")
        # a rewrite: the AOF now opens with an RDB snapshot (6.2's "REDIS0009"), and
        # what follows is appended to it as commands
        c.bgrewriteaof()
        wait_aof_rewrite(c)
        c.set("after-rewrite", "tail")
        c.xadd("kept-stream", {"f": "2"}, id="2-1")
        c.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert (rdir / "appendonly.aof").read_bytes().startswith(b"REDIS0009")
    assert mode(rdir / "appendonly.aof") == 0o644
    assert mode(rdir / "redis.log") == 0o644


def test_old_data_folder_is_upgraded_in_place(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _old_style_folder(root)
    assert mode(root) == 0o755
    assert not (root / "pg" / PASSWORD_FILE).exists()

    root = prepare_data_dir(root)
    pg: EmbeddedPostgres | None = None
    rd: EmbeddedRedis | None = None
    try:
        pg = start_postgres(root / "pg", fsync=False)
        rd = start_redis(root / "redis")
        assert [r["v"] for r in pg_sql(pg, "select v from kept")] == ["row"]
        _assert_kept(rd)
        with pytest.raises(asyncpg.InvalidPasswordError):
            pg_connect(pg)
        assert raw_redis(rd.port, "GET kept")[0].startswith(b"-NOAUTH")
        assert mode(root) == 0o700
        # Valkey moved the single AOF into its folder, as its base file
        assert not (root / "redis" / AOF_FILE).exists()
        manifest = (root / "redis" / AOF_DIR / AOF_MANIFEST).read_text()
        assert f"file {AOF_FILE} seq 1 type b" in manifest, manifest
        assert mode(root / "redis" / AOF_DIR / AOF_FILE) == 0o600
        assert_private(root)
        # and from then on it starts like any other, also once Valkey rewrote the AOF
        # (the 6.2 file gives way to a snapshot of Valkey's own)
        c = redis.Redis.from_url(rd.url)
        try:
            c.set("by-valkey", "1")
            c.bgrewriteaof()
            wait_aof_rewrite(c)
        finally:
            c.close()
        pg.stop()
        rd.stop()
        assert not (root / "redis" / AOF_DIR / AOF_FILE).exists()
        pg = start_postgres(root / "pg", fsync=False)
        rd = start_redis(root / "redis")
        assert [r["v"] for r in pg_sql(pg, "select v from kept")] == ["row"]
        _assert_kept(rd)
        assert raw_redis(rd.port, f"AUTH {rd.password}", "GET by-valkey")[1] == b"$1"
    finally:
        if rd is not None:
            rd.stop()
        if pg is not None:
            pg.stop()


def test_a_redis_62_left_running_is_stopped_and_its_folder_taken_over(tmp_path: Path) -> None:
    """The server of an earlier version still runs on the folder (``redis-server``, not
    ``valkey-server``): it is found by its working folder and stopped (it writes its AOF out
    as it goes) before Valkey starts there."""
    root = prepare_data_dir(tmp_path / "data")
    rdir = root / "redis"
    rdir.mkdir(mode=0o700)
    server, port = start_redis_62(rdir)
    rd: EmbeddedRedis | None = None
    try:
        c = redis.Redis(port=port, socket_timeout=5)
        c.set("kept", "key")
        c.hset("kept-hash", mapping={"f": "v"})
        c.xadd("kept-stream", {"f": "1"}, id="1-1")
        c.set("after-rewrite", "tail")
        c.xadd("kept-stream", {"f": "2"}, id="2-1")
        c.close()
        rd = start_redis(rdir)
        assert server.wait(10) is not None
        _assert_kept(rd)
        assert psutil.Process(rd.pid()).name() == "valkey-server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        if rd is not None:
            rd.stop()


def _assert_kept(rd: EmbeddedRedis) -> None:
    """What ``_old_style_folder`` wrote with Redis 6.2 reads back from Valkey."""
    c = redis.Redis.from_url(rd.url)
    try:
        assert c.get("kept") == b"key"
        assert c.hgetall("kept-hash") == {b"f": b"v"}
        assert c.get("after-rewrite") == b"tail"
        assert [(i, f) for i, f in c.xrange("kept-stream")] == [
            (b"1-1", {b"f": b"1"}),
            (b"2-1", {b"f": b"2"}),
        ]
    finally:
        c.close()
