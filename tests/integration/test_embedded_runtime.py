"""Real embedded PostgreSQL + Valkey: restart, crash recovery, leftovers of a previous run,
AOF repair, and the AOF of the Redis 6.2 of earlier versions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest
import redis

from im_server.runtime.aof_repair import AOF_DIR, AOF_FILE, AOF_MANIFEST
from im_server.runtime.embedded import (
    STORE_SYSTEM_USER,
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedRuntimeError,
    free_port,
    read_password,
    start_postgres,
    start_redis,
    wait_for_port,
)
from tests.support import wait_aof_rewrite

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- helpers


def alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 of a container may never reap orphans)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)  # the poll interval of a wait for a condition
    return True


def pg_fetch(pg: EmbeddedPostgres, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=pg.port,
            user="postgres",
            password=read_password(pg.data_dir),
            database="postgres",
        )
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def pg_write(pg: EmbeddedPostgres, value: str) -> None:
    pg_fetch(pg, "create table if not exists t (v text)")
    pg_fetch(pg, "insert into t values ($1)", value)


def pg_values(pg: EmbeddedPostgres) -> list[str]:
    return [r["v"] for r in pg_fetch(pg, "select v from t order by v")]


def rclient(r: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(r.url, socket_timeout=5)


def rget(r: EmbeddedRedis, key: str) -> bytes | None:
    c = rclient(r)
    try:
        value = c.get(key)
        assert value is None or isinstance(value, bytes)
        return value
    finally:
        c.close()


def rset(r: EmbeddedRedis, key: str, value: str) -> None:
    c = rclient(r)
    try:
        c.set(key, value)
    finally:
        c.close()


@pytest.fixture
def stoppers() -> Iterator[list[Callable[[], None]]]:
    """Whatever a test registers here is stopped at teardown, even when it fails."""
    fns: list[Callable[[], None]] = []
    yield fns
    for fn in reversed(fns):
        with contextlib.suppress(Exception):  # best-effort cleanup
            fn()


def both(
    folder: Path, stoppers: list[Callable[[], None]], **pg_kwargs: Any
) -> tuple[EmbeddedPostgres, EmbeddedRedis]:
    pg = start_postgres(folder / "pg", **pg_kwargs)
    stoppers.append(pg.stop)
    r = start_redis(folder / "redis")
    stoppers.append(r.stop)
    return pg, r


# --------------------------------------------------------------------------- tests


def test_restart_keeps_data(tmp_path: Path, stoppers: list[Callable[[], None]]) -> None:
    # A deep folder: the unix socket path would not fit in PGDATA (107 byte limit).
    folder = tmp_path / ("d" * 60) / "im-data"
    pg, r = both(folder, stoppers)
    pg_pw, r_pw = read_password(pg.data_dir), read_password(r.data_dir)
    assert pg.url == f"postgresql+asyncpg://postgres:{pg_pw}@127.0.0.1:{pg.port}/postgres"
    assert r.url == f"redis://:{r_pw}@127.0.0.1:{r.port}/0"
    assert pg.display_url == f"postgresql+asyncpg://postgres:***@127.0.0.1:{pg.port}/postgres"
    assert r.display_url == f"redis://:***@127.0.0.1:{r.port}/0"
    assert pg_pw not in repr(pg) and r_pw not in repr(r)
    assert pg.socket_dir is not None and pg.socket_dir != pg.data_dir
    assert pg.port != r.port
    pg_pid, r_pid = pg.pid(), r.pid()
    assert pg_pid and r_pid
    # Own sessions: a Ctrl-C for the parent's terminal does not reach them.
    assert os.getsid(pg_pid) != os.getsid(0) and os.getsid(r_pid) != os.getsid(0)
    assert (r.data_dir / "redis.pid").read_text().strip() == str(r_pid)
    wait_for_port("127.0.0.1", pg.port, 1.0)

    pg_write(pg, "row-1")
    rset(r, "k", "v1")
    pg.stop()
    r.stop()
    assert pg.pid() is None and r.pid() is None
    assert not alive(pg_pid) and not alive(r_pid)
    pg.stop()  # idempotent
    r.stop()
    pg.kill()
    r.kill()
    assert not (pg.data_dir / "postmaster.pid").exists()
    assert not (r.data_dir / "redis.pid").exists()

    pg2, r2 = both(folder, stoppers)
    assert (pg2.password, r2.password) == (pg_pw, r_pw)  # kept, not made anew
    assert pg_values(pg2) == ["row-1"]
    assert rget(r2, "k") == b"v1"

    # A busy explicit port is a clear error (after the leftovers check, before starting).
    pg2.stop()
    r2.stop()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EmbeddedRuntimeError, match="already in use"):
            start_postgres(folder / "pg", port)
        with pytest.raises(EmbeddedRuntimeError, match="already in use"):
            start_redis(folder / "redis", port)
    with pytest.raises(TimeoutError):
        wait_for_port("127.0.0.1", port, 0.1)


def test_restart_after_sigkill_and_stale_pid_files(
    tmp_path: Path, stoppers: list[Callable[[], None]]
) -> None:
    pg, r = both(tmp_path, stoppers)
    pg_write(pg, "before-crash-1")
    rset(r, "k1", "1")

    # Crash 1: both SIGKILLed, their pid files stay behind (dead or zombie pids).
    pg.kill()
    r.kill()
    assert pg.pid() is None and r.pid() is None
    assert (pg.data_dir / "postmaster.pid").exists() and (r.data_dir / "redis.pid").exists()
    pg, r = both(tmp_path, stoppers)
    assert pg_values(pg) == ["before-crash-1"]
    assert rget(r, "k1") == b"1"
    pg_write(pg, "before-crash-2")
    rset(r, "k2", "2")

    # Crash 2: a backend is frozen so it outlives its postmaster (an orphan still attached
    # to the old shared memory), and the pid files now name a live process that is not
    # ours (pid reuse): this test process, which must of course survive.
    postmaster = psutil.Process(pg.pid())
    orphan = postmaster.children()[0]
    orphan.send_signal(signal.SIGSTOP)
    pg.kill()
    r.kill()
    assert alive(orphan.pid)
    pm_file = pg.data_dir / "postmaster.pid"
    lines = pm_file.read_text().splitlines()
    pm_file.write_text("\n".join([str(os.getpid()), *lines[1:]]) + "\n")
    (r.data_dir / "redis.pid").write_text(f"{os.getpid()}\n")

    pg, r = both(tmp_path, stoppers, port=free_port())
    assert not alive(orphan.pid)
    assert pg_values(pg) == ["before-crash-1", "before-crash-2"]
    assert rget(r, "k1") == b"1" and rget(r, "k2") == b"2"


def test_previous_run_left_alive(tmp_path: Path, stoppers: list[Callable[[], None]]) -> None:
    # An interrupted initdb of an even earlier run: a PGDATA with files but no PG_VERSION.
    (tmp_path / "pg" / "base").mkdir(parents=True)
    (tmp_path / "pg" / "junk").write_text("x")
    old_pg, old_r = both(tmp_path, stoppers, fsync=False)
    assert not (old_pg.data_dir / "junk").exists()
    pg_write(old_pg, "x")
    rset(old_r, "k", "x")
    old_pg_pid, old_r_pid = old_pg.pid(), old_r.pid()
    assert old_pg_pid and old_r_pid
    # "Forget" the handles: a new run starts on the same folder with other ports.
    new_pg_port, new_r_port = free_port(), free_port()
    pg = start_postgres(tmp_path / "pg", new_pg_port, fsync=False)
    stoppers.append(pg.stop)
    r = start_redis(tmp_path / "redis", new_r_port)
    stoppers.append(r.stop)

    assert (pg.port, r.port) == (new_pg_port, new_r_port)
    assert not alive(old_pg_pid)
    assert old_r.process is not None
    assert old_r.process.wait(5) is not None  # reaped: it was our child
    assert pg.pid() not in (None, old_pg_pid)
    assert pg_values(pg) == ["x"]
    assert rget(r, "k") == b"x"


def last_increment(r: EmbeddedRedis) -> Path:
    """The AOF file Valkey appends to: the last ``type i`` file of its manifest."""
    manifest = (r.data_dir / AOF_DIR / AOF_MANIFEST).read_text()
    names = [ln.split()[1] for ln in manifest.splitlines() if ln.endswith(" type i")]
    assert names, manifest
    return r.data_dir / AOF_DIR / names[-1]


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(b"garbage\x00\xff\r\n", id="garbage"),  # needs valkey-check-aof --fix
        pytest.param(b"*3\r\n$3\r\nSET\r\n$1\r\nz\r\n$5\r\nab", id="truncated"),
    ],
)
def test_half_written_aof(tmp_path: Path, stoppers: list[Callable[[], None]], tail: bytes) -> None:
    r = start_redis(tmp_path / "redis", appendfsync="always")
    stoppers.append(r.stop)
    for i in range(50):
        rset(r, f"k{i}", str(i))
    # A rewrite: the keys so far go into a snapshot of Valkey's own (an RDB opening with
    # "VALKEY", which the check tool cannot read), the rest into a new increment.
    c = rclient(r)
    try:
        c.bgrewriteaof()
        wait_aof_rewrite(c)
    finally:
        c.close()
    for i in range(50, 60):
        rset(r, f"k{i}", str(i))
    r.kill()
    aof = last_increment(r)
    base = [f for f in (r.data_dir / AOF_DIR).iterdir() if f.name.endswith(".base.rdb")]
    assert len(base) == 1 and base[0].read_bytes().startswith(b"VALKEY")
    base_bytes = base[0].read_bytes()
    with open(aof, "ab") as fh:
        fh.write(tail)

    r = start_redis(tmp_path / "redis")
    stoppers.append(r.stop)
    assert [rget(r, f"k{i}") for i in (0, 49, 50, 59)] == [b"0", b"49", b"50", b"59"]
    assert rget(r, "z") is None
    assert base[0].read_bytes() == base_bytes  # the snapshot is never touched
    rset(r, "after", "1")
    r.stop()
    r = start_redis(tmp_path / "redis")
    stoppers.append(r.stop)
    assert rget(r, "after") == b"1" and rget(r, "k59") == b"59"


def test_a_damaged_snapshot_is_not_cut(tmp_path: Path, stoppers: list[Callable[[], None]]) -> None:
    """Only the end of the last AOF file is ever repaired: a base snapshot that does not
    load is an error with Valkey's own words, and the file is left as it was."""
    r = start_redis(tmp_path / "redis", appendfsync="always")
    stoppers.append(r.stop)
    rset(r, "k", "v")
    r.stop()
    base = next(f for f in (r.data_dir / AOF_DIR).iterdir() if f.name.endswith(".base.rdb"))
    damaged = base.read_bytes()[:-12] + b"garbage\x00\xff\r\n"
    base.write_bytes(damaged)
    with pytest.raises(EmbeddedRuntimeError, match="Valkey exited with status"):
        start_redis(tmp_path / "redis")
    assert base.read_bytes() == damaged


def _resp(*args: str) -> bytes:
    """One command as an AOF holds it (RESP)."""
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


# What Redis 6.2 wrote to its single appendonly.aof (the embedded server of earlier
# versions): the keys im-server keeps, as the commands 6.2 logs for them (SELECT first,
# expiries as absolute PEXPIREAT, a stream with its consumer group).
REDIS_62_AOF = b"".join(
    [
        _resp("SELECT", "0"),
        _resp("SET", "im:seq:{p0}:s:1:2", "41"),
        _resp("HSET", "im:conv:{p0}:s:1:2", "max", "41", "epoch", "run-1"),
        _resp("SET", "im:dd:{p0}:1:c1", "41"),
        _resp("PEXPIREAT", "im:dd:{p0}:1:c1", "4102444800000"),
        _resp("XADD", "im:stream:{p0}", "1700000000000-0", "m", "payload"),
        _resp("XGROUP", "CREATE", "im:stream:{p0}", "persist", "0"),
        _resp("ZADD", "im:lp", "1", "7"),
        _resp("SADD", "im:nodes", "gw1"),
    ]
)


def _assert_62_keys(r: EmbeddedRedis) -> None:
    c = rclient(r)
    try:
        assert c.get("im:seq:{p0}:s:1:2") == b"41"
        assert c.hgetall("im:conv:{p0}:s:1:2") == {b"max": b"41", b"epoch": b"run-1"}
        assert c.get("im:dd:{p0}:1:c1") == b"41"
        assert c.pexpiretime("im:dd:{p0}:1:c1") == 4102444800000
        assert c.xrange("im:stream:{p0}") == [(b"1700000000000-0", {b"m": b"payload"})]
        assert [g["name"] for g in c.xinfo_groups("im:stream:{p0}")] == [b"persist"]
        assert c.zscore("im:lp", "7") == 1.0
        assert c.smembers("im:nodes") == {b"gw1"}
    finally:
        c.close()


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(b"", id="whole"),
        pytest.param(b"garbage\x00\xff\r\n", id="garbage"),
        pytest.param(b"*3\r\n$3\r\nSET\r\n$1\r\nz\r\n$5\r\nab", id="truncated"),
    ],
)
def test_a_redis_62_aof_loads_in_place(
    tmp_path: Path, stoppers: list[Callable[[], None]], tail: bytes
) -> None:
    """A folder of an earlier version: one ``appendonly.aof`` as Redis 6.2 wrote it, maybe
    with the broken end of a crash. Valkey moves it into its AOF folder as the base file,
    everything in it loads, and from then on it is an AOF like any other."""
    folder = tmp_path / "redis"
    folder.mkdir()
    (folder / AOF_FILE).write_bytes(REDIS_62_AOF + tail)

    r = start_redis(folder)
    stoppers.append(r.stop)
    _assert_62_keys(r)
    assert rget(r, "z") is None
    assert not (folder / AOF_FILE).exists()
    moved = folder / AOF_DIR / AOF_FILE
    assert moved.read_bytes() == REDIS_62_AOF  # a broken end cut off, nothing else
    rset(r, "after", "1")
    r.kill()
    r = start_redis(folder)
    stoppers.append(r.stop)
    _assert_62_keys(r)
    assert rget(r, "after") == b"1"


CHILD = """
import json, os, sys, time
from pathlib import Path
from im_server.runtime.embedded import start_postgres, start_redis
folder = Path(sys.argv[1])
pg = start_postgres(folder / "pg", fsync=False)
r = start_redis(folder / "redis")
import redis
redis.Redis.from_url(r.url).set("from-child", "1")
print(json.dumps({"pg": pg.pid(), "redis": r.pid(), "uid": os.geteuid()}), flush=True)
time.sleep(60)
"""


def test_parent_process_group_killed(tmp_path: Path, stoppers: list[Callable[[], None]]) -> None:
    """``kill -9`` of the whole process group of an ``im-server serve``-like parent."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        pids = json.loads(child.stdout.readline())
        if pids["uid"] == 0:  # as root, Redis runs as the store user
            store_uid = pwd.getpwnam(STORE_SYSTEM_USER).pw_uid
            assert psutil.Process(pids["redis"]).uids().real == store_uid
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    # Redis follows its parent (PR_SET_PDEATHSIG), also when it runs as another user;
    # the postmaster, in its own session, stays.
    assert wait_gone(pids["redis"], 10)
    assert alive(pids["pg"])

    pg, r = both(tmp_path, stoppers, fsync=False)
    assert not alive(pids["pg"])
    assert pg_fetch(pg, "select 1 as one")[0]["one"] == 1
    assert rget(r, "from-child") == b"1"


# --------------------------------------------------------------------------- port races


@pytest.fixture
def thief() -> Iterator[socket.socket]:
    """Another process's listener, on a port that was free a moment ago: what a start
    racing with another one on the same machine meets between choosing a port and
    binding it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


def _first_pick(thief: socket.socket) -> Callable[[], int]:
    """A port chooser whose first answer is the thief's port, and free ports after."""
    taken = [int(thief.getsockname()[1])]

    def pick() -> int:
        return taken.pop() if taken else free_port()

    return pick


@pytest.mark.parametrize("store", ["postgres", "valkey", "s3"])
def test_a_port_taken_before_the_store_binds_it_is_exchanged(
    tmp_path: Path,
    stoppers: list[Callable[[], None]],
    thief: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store is started again on fresh ports (the real server process meets the
    taken port and fails; the start sees the port busy and tries again), and serves."""
    from im_server.runtime import postgres, redis_server, s3_config, s3_server

    stolen = int(thief.getsockname()[1])
    module = {"postgres": postgres, "valkey": redis_server, "s3": s3_config}[store]
    monkeypatch.setattr(module, "free_port", _first_pick(thief))
    caplog.set_level("WARNING", logger="im_server.runtime")
    if store == "postgres":
        pg = start_postgres(tmp_path / "pg", fsync=False)
        stoppers.append(pg.stop)
        assert pg.port != stolen and pg_fetch(pg, "SELECT 1 AS x")[0]["x"] == 1
    elif store == "valkey":
        rd = start_redis(tmp_path / "rd")
        stoppers.append(rd.stop)
        assert rd.port != stolen and rclient(rd).ping()
    else:
        s3 = s3_server.start_s3(tmp_path / "s3")
        stoppers.append(s3.stop)
        ports = json.loads((tmp_path / "s3" / "im-server.ports").read_text())
        assert stolen not in ports.values(), ports
    assert "taken by another process while starting" in caplog.text


def test_a_start_that_fails_for_good_says_why_in_one_line(tmp_path: Path) -> None:
    """``serve`` whose embedded object store cannot start (its keys file is broken): one
    line on stderr saying so, exit status 1, no traceback, and the stores it did start
    are stopped."""
    data = tmp_path / "data"
    (data / "s3").mkdir(parents=True, mode=0o700)
    (data / "s3" / "im-server.credentials").write_text("{not json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "im_server", "serve", "--port", str(free_port())]
        + ["--data-dir", str(data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("im-server:")]
    assert len(err) == 1 and "does not hold usable keys" in err[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(data) in " ".join(p.info["cmdline"] or [])
    ]
