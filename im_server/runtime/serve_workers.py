"""``im-server serve --workers N``: N server processes on one host:port.

Each worker binds its own listening socket with SO_REUSEPORT, so the kernel spreads new
connections over the workers and no process hands sockets to another. The workers are
ordinary gateway processes, each with a node name of its own (``<node>-<i>``): a frame
for a user connected to another worker goes through the cross-process fan-out, as it
does between machines. The parent only supervises: it restarts a worker that exits
unexpectedly (after a short back-off), and on SIGTERM/SIGINT stops them all (SIGTERM,
then SIGKILL after a timeout).

Background work in several workers (what was checked): the persister runs in worker 0
only (its partitions are leased, so more would be safe, but one per machine is what a
single process ran); the pusher and the thumbnailer lease their rows and run in every
worker; the cursor batcher, the receipt pusher, the token re-check and presence hold
per-process state about their own connections; the periodic jobs (notice outbox, account
deletion, upload and push-registration expiry, long-poll expiry, Redis epoch, node
presence) are written for several gateway processes already (row locks, forward-only or
idempotent writes). Per-process figures stay per process: rate limits (a user's
connections on several workers each get the limit) and metrics (each worker's
``/metrics``; with ``IM_METRICS_LISTEN=host:port`` worker i listens on port + i)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from im_server.runtime.processes import pdeathsig_preexec

log = logging.getLogger("im_server.workers")

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
STABLE_S = 30.0  # a worker that ran this long restarts after the shortest back-off again
STOP_TIMEOUT_S = 20.0  # graceful shutdown (uvicorn's 5 s, then the lifespan's steps)
POLL_S = 0.2


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket that other processes may bind too (SO_REUSEPORT); uvicorn
    listens on it. The address family is chosen as uvicorn chooses it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def check_port_free(host: str, port: int) -> None:
    """Raise OSError when something listens on host:port already. The probe binds without
    SO_REUSEPORT, so it also fails on a port that other SO_REUSEPORT servers share: a
    second ``serve`` on the same port is refused instead of silently joining the first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def metrics_listen_of(listen: str | None, index: int) -> str | None:
    """Worker ``index``'s metrics address: ``host:port`` becomes ``host:(port + index)``."""
    if not listen:
        return listen
    host, _, port = listen.rpartition(":")
    return f"{host}:{int(port) + index}"


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = BACKOFF_MIN_S
    restart_at: float | None = None


class Supervisor:
    """Runs ``count`` workers until :meth:`stop` (or SIGTERM/SIGINT once :meth:`run`
    installed its handlers). ``command(i)`` and ``env(i)`` give worker i's argv and
    environment."""

    def __init__(
        self,
        count: int,
        command: Callable[[int], list[str]],
        env: Callable[[int], dict[str, str]],
        *,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        self.workers = [_Worker(i) for i in range(count)]
        self.command = command
        self.env = env
        self.stop_timeout = stop_timeout
        self.restarts = 0
        self._stop = threading.Event()

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.poll() is None]

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        self._stop.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.stop)
        try:
            for w in self.workers:
                self._start(w)
            while not self._stop.wait(POLL_S):
                self._watch()
        finally:
            self._stop_all()
        return 0

    def _start(self, w: _Worker) -> None:
        # same process group as the parent: a Ctrl-C reaches every worker, and a kill of
        # the group kills them all; a worker whose parent dies gets SIGTERM (pdeathsig)
        w.proc = subprocess.Popen(
            self.command(w.index),
            env=self.env(w.index),
            preexec_fn=pdeathsig_preexec(os.getpid()),
        )
        w.started = time.monotonic()
        w.restart_at = None
        log.info("worker %d started (pid %d)", w.index, w.proc.pid)

    def _watch(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.restart_at is not None:
                if now >= w.restart_at and not self._stop.is_set():
                    self.restarts += 1
                    self._start(w)
                continue
            if w.proc is None or (code := w.proc.poll()) is None:
                continue
            if now - w.started >= STABLE_S:
                w.backoff = BACKOFF_MIN_S
            log.warning(
                "worker %d (pid %d) exited with %s; restarting it in %.1f s",
                w.index,
                w.proc.pid,
                _exit_text(code),
                w.backoff,
            )
            w.restart_at = now + w.backoff
            w.backoff = min(BACKOFF_MAX_S, w.backoff * 2)

    def _stop_all(self) -> None:
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for p in live:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.stop_timeout
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "worker pid %d still running after %.0f s: killed", p.pid, self.stop_timeout
                )
                p.kill()
                p.wait(10)
        log.info("all %d workers stopped", len(self.workers))


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
