"""Process and port helpers shared by the embedded PostgreSQL, Valkey and S3 supervisors."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil

log = logging.getLogger("im_server.runtime")
T = TypeVar("T")

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
_LOG_ROTATE_BYTES = 16 * 1024 * 1024
HIDDEN = "***"
_PR_SET_PDEATHSIG = 1


class EmbeddedRuntimeError(RuntimeError):
    """An embedded server could not be started or stopped; the message carries the log tail."""

    _TELLING = ("error", "fail", "fatal", "panic", "denied", "in use", "not available")

    def summary(self) -> str:
        """What went wrong, on one line: the message's first line, and the last line of
        the store's log tail (which the message carries) that names an error."""
        lines = [ln.strip() for ln in str(self).strip().splitlines() if ln.strip()]
        if not lines:
            return type(self).__name__
        why = next(
            (ln for ln in reversed(lines[1:]) if any(w in ln.lower() for w in self._TELLING)),
            None,
        )
        tail = f": {why[:300]}" if why else ""
        return f"{lines[0]}{tail} (the store's log is in the data folder)"


# --------------------------------------------------------------------------- ports


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


def check_port(port: int, what: str) -> None:
    if not _port_is_free(port):
        raise EmbeddedRuntimeError(
            f"{what}: port {HOST}:{port} is already in use by another process; "
            "choose another port or leave it unset to pick a free one"
        )


PORT_ATTEMPTS = 4
"""How many times a store started on ports of our choosing is started again on fresh
ports when another process took one of them between the choice and the bind."""


def with_fresh_ports(
    start: Callable[[bool], T], chosen: Callable[[], Iterable[int]], what: str
) -> T:
    """``start(fresh)`` until it works, at most ``PORT_ATTEMPTS`` times. A port is chosen
    free (:func:`free_port`) and bound later by the store's own process: another process
    on the machine may take it in between (several stores starting at once make it
    likely). When a start fails and one of the ports it was given is busy now that its
    process is gone, that is what happened: start again with fresh ports (``fresh``
    True). Any other failure is raised at once."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start(attempt > 1)
        except EmbeddedRuntimeError:
            taken = [p for p in chosen() if not _port_is_free(p)]
            if not taken or attempt == PORT_ATTEMPTS:
                raise
            log.warning(
                "%s: port %s was taken by another process while starting; "
                "starting again on fresh ports (attempt %d of %d)",
                what,
                ", ".join(map(str, taken)),
                attempt + 1,
                PORT_ATTEMPTS,
            )
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- logs


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a server log (never through a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - 16384))
            data = fh.read()
    except OSError:
        return f"(no log at {path})"
    text = data.decode("utf-8", "replace").splitlines()[-lines:]
    return "\n".join(text) if text else f"(log {path} is empty)"


def rotate_log(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.lstat().st_size > _LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))


def scrub(text: str, hide: Iterable[str]) -> str:
    """``text`` with every secret in ``hide`` replaced by ``***``."""
    for secret in hide:
        if secret:
            text = text.replace(secret, HIDDEN)
    return text


def store_env() -> dict[str, str]:
    """The environment for a store process: ours without the IM_* settings (they may hold
    the stores' URLs with their passwords, which the store processes have no use for)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("IM_")}


# --------------------------------------------------------------------------- processes


def proc(pid: int) -> psutil.Process | None:
    """The live (non-zombie) process ``pid``, or None."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def pid_exists(pid: int) -> bool:
    """True when the pid is taken by anything, zombies and foreign processes included."""
    return pid > 0 and psutil.pid_exists(pid)


def _reap_if_child(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_dead(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` is gone or a zombie. True when it is."""
    deadline = time.monotonic() + timeout
    while True:
        _reap_if_child(pid)
        if proc(pid) is None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def send_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def terminate(pid: int, *, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """Send ``sig``, wait up to ``grace`` seconds, then SIGKILL and wait again."""
    send_signal(pid, sig)
    if not wait_dead(pid, grace):
        send_signal(pid, signal.SIGKILL)
        wait_dead(pid, 5.0)


def _same_path(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _names(name: str | tuple[str, ...]) -> tuple[str, ...]:
    return (name,) if isinstance(name, str) else name


def procs_in_dir(name: str | tuple[str, ...], directory: Path) -> list[psutil.Process]:
    """Live processes called ``name`` (or any of several names) whose working directory is
    ``directory``.

    PostgreSQL processes chdir to PGDATA and Valkey chdirs to its ``dir``, so this finds
    exactly the servers of this data folder (and nothing of anybody else).
    """
    names = _names(name)
    found: list[psutil.Process] = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] not in names or p.pid == os.getpid():
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if _same_path(p.cwd(), directory):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def is_ours(
    p: psutil.Process,
    name: str | tuple[str, ...],
    directory: Path,
    needles: Sequence[str] = (),
) -> bool:
    """``p`` is called ``name`` (or any of several names) and works in ``directory``, or
    names it (or one of ``needles``) on its command line."""
    try:
        if p.name() not in _names(name):
            return False
        with contextlib.suppress(psutil.AccessDenied, psutil.ZombieProcess):
            if _same_path(p.cwd(), directory):
                return True
        cmdline = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return str(directory) in cmdline or any(n in cmdline for n in needles)


def run(
    cmd: Sequence[str],
    *,
    what: str,
    timeout: float,
    input_text: str | None = None,
    hide: Sequence[str] = (),
    **kwargs: Any,
) -> str:
    """Run ``cmd``; output goes through temp files (a pipe would be inherited by the daemon).

    Every string in ``hide`` (passwords, password hashes) is replaced by ``***`` in the
    output that ends up in an exception message.
    """
    with tempfile.TemporaryFile("w+") as out:
        try:
            done = subprocess.run(
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
            text = scrub(out.read(), hide)
            raise EmbeddedRuntimeError(
                f"{what}: timed out after {timeout}s\n{text[-4000:]}"
            ) from exc
        out.seek(0)
        text = out.read()
    if done.returncode != 0:
        raise EmbeddedRuntimeError(
            f"{what}: exit status {done.returncode}\n{scrub(text, hide)[-4000:]}"
        )
    return text


_libc: ctypes.CDLL | None = None


def pdeathsig_preexec(parent_pid: int) -> Callable[[], None]:
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
