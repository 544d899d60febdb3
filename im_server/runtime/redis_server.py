"""The embedded Redis: a config file with a password, start, stop, AOF repair.

The settings go through ``redis.conf`` (0600) rather than the command line, which every
user can read in ``/proc/<pid>/cmdline``. Every client must AUTH; the admin commands that
could write files elsewhere, load code or replace the data (``CONFIG``, ``DEBUG``,
``MODULE``, ``REPLICAOF``/``SLAVEOF``) are disabled. Redis runs with umask 077, so its
AOF and log are for its user only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    open_private_log,
    read_private,
    redis_server_binary,
    secure_tree,
    store_user,
    write_private,
)
from im_server.runtime.passwords import load_or_create_password
from im_server.runtime.processes import (
    HIDDEN,
    HOST,
    START_TIMEOUT,
    STOP_TIMEOUT,
    EmbeddedRuntimeError,
    check_port,
    free_port,
    is_ours,
    proc,
    procs_in_dir,
    rotate_log,
    run,
    send_signal,
    store_env,
    tail,
    terminate,
    wait_dead,
)

log = logging.getLogger("im_server.runtime")

CONFIG_FILE = "redis.conf"
DISABLED_COMMANDS = ("CONFIG", "DEBUG", "MODULE", "REPLICAOF", "SLAVEOF")
_PR_SET_PDEATHSIG = 1
_AOF_ERROR_MARKERS = ("Bad file format reading the append only file", "Unexpected end of file")


def _quote(value: str) -> str:
    """A double-quoted string as redis.conf reads it (``sdssplitargs``)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable() and ch.isascii():
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return '"' + "".join(out) + '"'


def redis_config(data_dir: Path, port: int, password: str, appendfsync: str) -> str:
    """The whole redis.conf of the embedded Redis."""
    lines = [
        "# Written by im-server at every start; edits here are overwritten.",
        f"bind {HOST}",
        "protected-mode yes",
        f"port {port}",
        f"dir {_quote(str(data_dir))}",
        f"requirepass {_quote(password)}",
        'save ""',
        "appendonly yes",
        f"appendfsync {appendfsync}",
        "aof-load-truncated yes",
        "daemonize no",
        'logfile ""',
        *(f'rename-command {c} ""' for c in DISABLED_COMMANDS),
    ]
    return "\n".join(lines) + "\n"


def _redis_url(password: str, port: int) -> str:
    return f"redis://:{password}@{HOST}:{port}/0"


_libc: ctypes.CDLL | None = None


def _pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGTERM the child when the forking thread's process dies.

    CPython runs preexec_fn after it switched to the child's user and group, so the
    setting survives that switch (the kernel clears it on a credential change)."""
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
    url: str = field(repr=False)  # holds the password: print ``display_url``
    process: subprocess.Popen[bytes] | None = None
    password: str = field(default="", repr=False)

    @property
    def display_url(self) -> str:
        """``url`` with the password replaced by ``***``, for logs and messages."""
        return _redis_url(HIDDEN, self.port)

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
        p = proc(pid)
        if p is None or not is_ours(p, "redis-server", self.data_dir, (f":{self.port}",)):
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
                terminate(pid, grace=STOP_TIMEOUT)
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
            send_signal(pid, signal.SIGKILL)
            wait_dead(pid, 10.0)


def _cleanup_previous_redis(data_dir: Path, port: int | None, notes: list[str]) -> None:
    pid_file = data_dir / "redis.pid"
    needles = (f":{port}",) if port is not None else ()
    try:
        pid: int | None = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        p = proc(pid)
        if p is not None and is_ours(p, "redis-server", data_dir, needles):
            notes.append(f"stopped redis {pid} left running")
            terminate(pid, grace=5.0)
        else:
            notes.append(f"removed stale redis.pid ({pid})")
    pid_file.unlink(missing_ok=True)
    for p in procs_in_dir("redis-server", data_dir):
        notes.append(f"stopped orphan redis {p.pid}")
        terminate(p.pid, grace=5.0)


def _fix_aof(aof: Path, user: StoreUser) -> str:
    """``redis-check-aof --fix``: the redis-server binary acts as it when argv[0] says so."""
    exe = redis_server_binary()
    sibling = Path(exe).with_name("redis-check-aof")
    if sibling.exists():
        cmd, kwargs = [str(sibling), "--fix", str(aof)], {}
    else:
        cmd, kwargs = ["redis-check-aof", "--fix", str(aof)], {"executable": exe}
    return run(
        cmd,
        what="redis-check-aof --fix",
        timeout=300,
        input_text="y\n",
        cwd=str(aof.parent),
        env=store_env(),
        umask=0o077,
        **kwargs,
        **user.run_kwargs(),
    )


def _redis_ping(port: int, password: str) -> bool:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: redis-py >= 6 retries with backoff by default, which would hide for
    # seconds that the server process already exited.
    client = redis.Redis(
        host=HOST,
        port=port,
        password=password,
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


def _spawn_redis(data_dir: Path, user: StoreUser, log_fd: int) -> subprocess.Popen[bytes]:
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only arm it from the
    # main thread (a to_thread worker may go away while the server is meant to keep running).
    preexec = None
    if threading.current_thread() is threading.main_thread():
        preexec = _pdeathsig_preexec(os.getpid())
    return subprocess.Popen(
        [redis_server_binary(), str(data_dir / CONFIG_FILE)],
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        cwd=str(data_dir),
        env=store_env(),
        umask=0o077,  # the AOF, its rewrites and anything else Redis writes: 0600
        start_new_session=True,  # no SIGINT from the parent's terminal
        preexec_fn=preexec,
        **user.run_kwargs(),
    )


def _write_config(path: Path, text: str, user: StoreUser) -> None:
    try:
        if read_private(path, user) == text:
            return
    except FileNotFoundError:
        pass
    write_private(path, text, user)


def start_redis(
    data_dir: Path, port: int | None = None, *, appendfsync: str = "everysec"
) -> EmbeddedRedis:
    """Start redis-server with AOF persistence in ``data_dir`` on 127.0.0.1:``port``.

    A redis of a previous run on the same dir is stopped first; an AOF with a broken tail
    is repaired with ``redis-check-aof --fix`` (what follows the first bad byte is lost).
    The returned ``url`` carries the password (kept in ``data_dir/im-server.password``).
    """
    if appendfsync not in ("always", "everysec", "no"):
        raise ValueError(f"appendfsync must be always|everysec|no, not {appendfsync!r}")
    t0 = time.monotonic()
    data_dir = Path(data_dir).expanduser().absolute()
    user = store_user()
    notes: list[str] = []
    make_private_dir(data_dir, user)
    _cleanup_previous_redis(data_dir, port, notes)
    # Older versions ran Redis as root with umask 022: take the files over, make them 0600.
    secure_tree(data_dir, user)
    password = load_or_create_password(data_dir, user)
    if port is None:
        port = free_port()
    check_port(port, "redis")
    _write_config(data_dir / CONFIG_FILE, redis_config(data_dir, port, password, appendfsync), user)

    log_file = data_dir / "redis.log"
    aof = data_dir / "appendonly.aof"
    rotate_log(log_file)
    fixed = False
    while True:
        log_fd = open_private_log(log_file, user)
        try:
            log_start = os.fstat(log_fd).st_size
            proc_ = _spawn_redis(data_dir, user, log_fd)
        finally:
            os.close(log_fd)
        write_private(data_dir / "redis.pid", f"{proc_.pid}\n", user)
        deadline = time.monotonic() + START_TIMEOUT
        while proc_.poll() is None and not _redis_ping(port, password):
            if time.monotonic() >= deadline:
                proc_.kill()
                proc_.wait(10)
                raise EmbeddedRuntimeError(
                    f"Redis on {HOST}:{port} does not answer PING after {START_TIMEOUT}s\n"
                    f"--- tail of {log_file} ---\n{tail(log_file)}"
                )
            time.sleep(0.005)
        if proc_.poll() is None:
            break
        proc_.wait()
        with open(log_file, "rb") as fh:
            fh.seek(log_start)
            new_log = fh.read().decode("utf-8", "replace")
        if not fixed and aof.exists() and any(m in new_log for m in _AOF_ERROR_MARKERS):
            size = aof.stat().st_size
            _fix_aof(aof, user)
            notes.append(f"repaired AOF ({size} -> {aof.stat().st_size} bytes)")
            fixed = True
            continue
        (data_dir / "redis.pid").unlink(missing_ok=True)
        raise EmbeddedRuntimeError(
            f"Redis exited with status {proc_.returncode} while starting on {HOST}:{port}\n"
            f"--- tail of {log_file} ---\n{tail(log_file)}"
        )

    log.info(
        "redis: %s; started pid %d on %s:%d (appendfsync=%s) in %.2fs",
        "; ".join(notes) or "clean start",
        proc_.pid,
        HOST,
        port,
        appendfsync,
        time.monotonic() - t0,
    )
    return EmbeddedRedis(
        data_dir=data_dir,
        port=port,
        url=_redis_url(password, port),
        process=proc_,
        password=password,
    )
