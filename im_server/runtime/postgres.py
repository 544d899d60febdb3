"""The embedded PostgreSQL: initdb, password authentication, start, stop, crash leftovers.

Every connection needs the superuser's password (SCRAM), over TCP on 127.0.0.1 and over
the unix socket, whose folder is PGDATA or a 0700 temp folder. The password is set with
the server stopped, through single-user mode (``postgres --single``, statement on stdin),
which works the same for a new cluster and for one made by an older version with trust
authentication. What is sent is the SCRAM verifier, not the password. A marker in PGDATA
records which password was applied, so the step runs again only when the password file
changed (or a crash came between the two).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.ownership import (
    StoreUser,
    open_prefix,
    secure_path,
    store_user,
)
from im_server.runtime.passwords import (
    load_or_create_password,
)
from im_server.runtime.pg_init import PG_SUPERUSER, ensure_auth, initdb, pg_bin
from im_server.runtime.processes import (
    HIDDEN,
    HOST,
    START_TIMEOUT,
    STOP_TIMEOUT,
    EmbeddedRuntimeError,
    check_port,
    free_port,
    is_ours,
    pid_exists,
    proc,
    procs_in_dir,
    rotate_log,
    run,
    send_signal,
    store_env,
    tail,
    terminate,
    wait_dead,
    with_fresh_ports,
)

log = logging.getLogger("im_server.runtime")

_SOCKET_PATH_BUDGET = 100  # sun_path holds 107 bytes + NUL; keep a margin


def _pg_socket_dir(pgdata: Path) -> Path:
    """PGDATA itself when the socket path fits in sun_path, else a short private temp dir."""
    if len(os.fsencode(pgdata / ".s.PGSQL.65535.lock")) <= _SOCKET_PATH_BUDGET:
        return pgdata
    digest = hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"im-pg-{digest}"


def _prepare_socket_dir(sock_dir: Path, user: StoreUser) -> None:
    """The socket folder must be a real folder of ours, 0700: in the shared temp folder,
    anybody could have made it first."""
    with contextlib.suppress(FileExistsError):
        sock_dir.mkdir(mode=0o700)
    st = sock_dir.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (user.effective_uid, os.geteuid()):
        raise EmbeddedRuntimeError(
            f"socket dir {sock_dir} is not a folder of the user running PostgreSQL; "
            "remove it, or use a data folder with a shorter path"
        )
    secure_path(sock_dir, user)
    if user.uid is not None:
        open_prefix(sock_dir, user.uid)


def read_postmaster_pid(pgdata: Path) -> tuple[int | None, int | None]:
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


def pg_url(password: str, port: int) -> str:
    return f"postgresql+asyncpg://{PG_SUPERUSER}:{password}@{HOST}:{port}/postgres"


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int
    url: str = field(repr=False)  # holds the password: print ``display_url``
    socket_dir: Path | None = field(default=None, repr=False)
    log_file: Path | None = field(default=None, repr=False)
    _user: StoreUser = field(default_factory=StoreUser, repr=False)
    password: str = field(default="", repr=False)

    @property
    def display_url(self) -> str:
        """``url`` with the password replaced by ``***``, for logs and messages."""
        return pg_url(HIDDEN, self.port)

    def pid(self) -> int | None:
        """The postmaster's pid while it runs on this PGDATA, else None."""
        pid, _ = read_postmaster_pid(self.data_dir)
        if pid is None:
            return None
        p = proc(pid)
        if p is None or not is_ours(p, "postgres", self.data_dir):
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
        send_signal(pid, signal.SIGKILL)
        wait_dead(pid, 10.0)


def _stop_postmaster(pgdata: Path, pid: int, user: StoreUser, timeout: float) -> bool:
    """``pg_ctl stop -m fast``; SIGKILL the whole cluster if that fails. True if clean."""
    try:
        run(
            [
                pg_bin("pg_ctl"),
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
            env=store_env(),
            **user.run_kwargs(),
        )
    except EmbeddedRuntimeError as exc:
        log.warning("pg_ctl stop failed for postmaster %d, killing it: %s", pid, exc)
    if wait_dead(pid, 5.0):
        return True
    _kill_postgres_tree(pid, pgdata)
    return False


def _kill_postgres_tree(pid: int, pgdata: Path) -> None:
    """SIGKILL a postmaster and every postgres process still working in ``pgdata``."""
    send_signal(pid, signal.SIGKILL)
    wait_dead(pid, 5.0)
    for p in procs_in_dir("postgres", pgdata):
        send_signal(p.pid, signal.SIGKILL)
    for p in procs_in_dir("postgres", pgdata):
        wait_dead(p.pid, 5.0)


def _cleanup_previous_postgres(
    pgdata: Path, sock_dir: Path, user: StoreUser, notes: list[str]
) -> None:
    pid_file = pgdata / "postmaster.pid"
    pid, old_port = read_postmaster_pid(pgdata)
    if pid is not None:
        p = proc(pid)
        if p is not None and is_ours(p, "postgres", pgdata):
            notes.append(f"stopped postmaster {pid} left running on port {old_port}")
            if not _stop_postmaster(pgdata, pid, user, 10.0):
                notes.append(f"SIGKILLed postmaster {pid}")
        elif pid_exists(pid):
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
    orphans = procs_in_dir("postgres", pgdata)
    if orphans:
        notes.append(f"killed {len(orphans)} orphan postgres process(es)")
        for p in orphans:
            send_signal(p.pid, signal.SIGKILL)
        for p in orphans:
            wait_dead(p.pid, 5.0)
        pid, _ = read_postmaster_pid(pgdata)
        if pid is not None and pid_exists(pid) and proc(pid) is None:
            pid_file.unlink(missing_ok=True)

    # No postgres of ours runs any more: socket files/locks in our own socket dir are stale
    # (a zombie pid in a .lock would make postgres refuse the port).
    if sock_dir.is_dir() and not sock_dir.is_symlink():
        for f in sock_dir.glob(".s.PGSQL.*"):
            f.unlink(missing_ok=True)


def _pg_ready(port: int, password: str) -> bool:
    try:
        out = subprocess.run(
            [
                pg_bin("psql"),
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
            # the environment of a process is readable by its own user only
            env={**store_env(), "PGCONNECT_TIMEOUT": "5", "PGPASSWORD": password},
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and out.stdout.strip() == "1"


def _secure_logs(pgdata: Path, user: StoreUser) -> None:
    """Server logs of older versions may be readable by others."""
    for f in pgdata.glob("postgres.log*"):
        if f.is_file() and not f.is_symlink():
            secure_path(f, user, 0o600)


def _launch(
    pgdata: Path, port: int, sock_dir: Path, user: StoreUser, password: str, fsync: bool
) -> EmbeddedPostgres:
    """``pg_ctl start`` on ``port`` and wait until it answers; ``EmbeddedRuntimeError``
    with the log's tail otherwise."""
    check_port(port, "postgres")
    _prepare_socket_dir(sock_dir, user)

    log_file = pgdata / "postgres.log"
    rotate_log(log_file)
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
        run(
            [
                pg_bin("pg_ctl"),
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
            env=store_env(),
            start_new_session=True,  # no SIGINT from the parent's terminal
            **user.run_kwargs(),
        )
    except EmbeddedRuntimeError as exc:
        raise EmbeddedRuntimeError(
            f"PostgreSQL did not start on {HOST}:{port} (PGDATA {pgdata}): {exc}\n"
            f"--- tail of {log_file} ---\n{tail(log_file)}"
        ) from exc

    pg = EmbeddedPostgres(
        data_dir=pgdata,
        port=port,
        url=pg_url(password, port),
        socket_dir=sock_dir,
        log_file=log_file,
        _user=user,
        password=password,
    )
    deadline = t_start + START_TIMEOUT
    while not _pg_ready(port, password):
        if time.monotonic() >= deadline or pg.pid() is None:
            pg.stop()
            raise EmbeddedRuntimeError(
                f"PostgreSQL on {HOST}:{port} does not answer 'select 1' "
                f"(PGDATA {pgdata})\n--- tail of {log_file} ---\n{tail(log_file)}"
            )
        time.sleep(0.05)
    return pg


def start_postgres(
    data_dir: Path, port: int | None = None, *, fsync: bool = True
) -> EmbeddedPostgres:
    """Start PostgreSQL on PGDATA ``data_dir`` (initdb first if needed) on 127.0.0.1:``port``.

    Leftovers of a previous run on the same PGDATA (a live postmaster, orphan backends,
    stale pid/lock files) are cleaned up first. ``port=None`` picks a free port; a busy
    explicit port raises ``EmbeddedRuntimeError``. The returned ``url`` carries the
    superuser password (kept in ``data_dir/im-server.password``).
    """
    t0 = time.monotonic()
    pgdata = Path(data_dir).expanduser().absolute()
    user = store_user()
    notes: list[str] = []

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if pgdata.exists() and not (pgdata / "PG_VERSION").exists():
        if any(pgdata.iterdir()):
            notes.append("wiped a PGDATA without PG_VERSION (interrupted initdb)")
            for p in procs_in_dir("postgres", pgdata):
                terminate(p.pid, sig=signal.SIGKILL)
            shutil.rmtree(pgdata)
    if not (pgdata / "PG_VERSION").exists():
        t_init = time.monotonic()
        initdb(pgdata, user, sync=fsync)
        notes.append(f"initdb in {time.monotonic() - t_init:.2f}s")
    user.chown_tree(pgdata)
    secure_path(pgdata, user)
    if user.uid is not None:
        open_prefix(pgdata, user.uid)

    sock_dir = _pg_socket_dir(pgdata)
    _cleanup_previous_postgres(pgdata, sock_dir, user, notes)
    password = load_or_create_password(pgdata, user)
    ensure_auth(pgdata, user, password, sync=fsync, notes=notes)
    _secure_logs(pgdata, user)

    chosen: list[int] = []

    def attempt(fresh: bool) -> EmbeddedPostgres:
        p = port if port is not None else free_port()
        chosen[:] = [] if port is not None else [p]
        return _launch(pgdata, p, sock_dir, user, password, fsync)

    pg = with_fresh_ports(attempt, lambda: chosen, "postgres")
    log.info(
        "postgres: %s; started pid %s on %s:%d (fsync=%s) in %.2fs total",
        "; ".join(notes) or "clean start",
        pg.pid(),
        HOST,
        pg.port,
        "on" if fsync else "off",
        time.monotonic() - t0,
    )
    return pg
