"""The same one-to-one load against Synapse and against im-server, in one run, so that the
comparison in docs/performance.md can be redone by anyone.

    ./scripts/bench synapse [--pairs 10] [--window 4] [--duration 20] [--size 60] [--json]

Synapse (``matrix-synapse[postgres]``, pinned to ``SYNAPSE_VERSION``) is installed from
its wheel into its own venv under ``.bench/synapse/`` (git-ignored) on first use, never
into the project's venv. It runs as one process on a PostgreSQL of its own (the embedded
one, fsync on, as for im-server), on 127.0.0.1 only, with a generated ``homeserver.yaml``:
a random registration secret, rate limits lifted, no federation listener, no media
repository, log to a file at WARNING. Everything else is Synapse's default (presence on;
``--no-presence`` turns it off).

Workload, the same on both: ``--pairs`` senders, each keeping ``--window`` sends in
flight in a room (a conversation) of its own with one receiver, for ``--duration``
seconds; every message carries its send time (in microseconds for Synapse: Matrix JSON has no
floats), and the receiver times its delivery.

- Synapse: users through the shared-secret admin registration
  (``/_synapse/admin/v1/register``), a ``trusted_private_chat`` room per pair that the
  receiver joins; ``PUT .../send/m.room.message/{txn}`` over HTTP/1.1 keep-alive (one
  connection per send in flight); receivers long-poll ``/sync`` with a filter that keeps
  only ``m.room.message`` timeline events.
- im-server: ``im-server bench``'s machinery (befriended pairs, WebSocket sends with
  acks, pushed deliveries).

Measured per server: messages delivered per second, delivery latency (send → receiver),
send latency (request → answer / ack), lost (answered but never delivered) and
duplicated, and the server CPU (user + system, psutil) over the phase: the Synapse
process and all PostgreSQL processes; the im-server gateway, Redis and PostgreSQL. The
servers run one after the other, Synapse first, each on fresh stores.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
from rich.console import Console
from rich.table import Table

from im_server.bench.common import report
from im_server.bench.load import percentile
from im_server.bench.phases import make_pairs, phase_bar, run_phase, verify
from im_server.bench.stack import Local, Procs
from im_server.client.transport import HttpPool, TransportError, request_sync
from im_server.runtime.embedded import EmbeddedPostgres, free_port, start_postgres

SYNAPSE_VERSION = "1.163.2"
SERVER_NAME = "bench.localhost"
ROOT = Path(__file__).resolve().parents[1]
INSTALL_DIR = ROOT / ".bench" / "synapse"
PASSWORD = "bench-password"
NO_LIMIT = {"per_second": 1_000_000, "burst_count": 1_000_000}
# Synapse's rate-limit sections (1.163); the nested ones take their sub-keys.
RATE_LIMITS = (
    "rc_message",
    "rc_registration",
    "rc_joins_per_room",
    "rc_room_creation",
    "rc_presence",
    "rc_3pid_validation",
    "rc_admin_redaction",
    "rc_key_requests",
    "rc_delayed_event_mgmt",
    "rc_profile",
)
NESTED_RATE_LIMITS = {
    "rc_login": ("address", "account", "failed_attempts"),
    "rc_joins": ("local", "remote"),
    "rc_invites": ("per_room", "per_user", "per_issuer"),
}
SYNC_FILTER = {
    "presence": {"types": []},
    "account_data": {"types": []},
    "room": {
        "state": {"types": [], "lazy_load_members": True},
        "ephemeral": {"types": []},
        "account_data": {"types": []},
        "timeline": {"types": ["m.room.message"], "limit": 1000},
    },
}

console = Console(stderr=True)


# --- pure parts: the registration MAC, the signing key, the configuration -------------


def registration_mac(secret: str, nonce: str, user: str, password: str, admin: bool) -> str:
    """The MAC of Synapse's shared-secret registration: HMAC-SHA1 keyed with the secret
    over nonce, user, password and admin flag, NUL-separated."""
    msg = b"\x00".join(
        [nonce.encode(), user.encode(), password.encode(), b"admin" if admin else b"notadmin"]
    )
    return hmac.new(secret.encode(), msg, hashlib.sha1).hexdigest()


def signing_key() -> str:
    """A signing-key file's line: any 32 random bytes are an ed25519 seed (saves running
    Synapse once with ``--generate-keys``)."""
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"ed25519 a_bench {seed}\n"


def homeserver_config(
    folder: Path, port: int, pg: dict[str, Any], secret: str, *, presence: bool = True
) -> dict[str, Any]:
    """``homeserver.yaml`` for the benchmark (JSON is YAML): client API on 127.0.0.1 only,
    no federation listener, no media repository, no rate limits, fast password hashing
    (users are made by the setup), logs at WARNING in a file."""
    limits: dict[str, Any] = {k: dict(NO_LIMIT) for k in RATE_LIMITS}
    for k, subs in NESTED_RATE_LIMITS.items():
        limits[k] = {s: dict(NO_LIMIT) for s in subs}
    return {
        "server_name": SERVER_NAME,
        "pid_file": str(folder / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {
            "name": "psycopg2",
            "args": {**pg, "cp_min": 5, "cp_max": 10},
        },
        "log_config": str(folder / "log.yaml"),
        "media_store_path": str(folder / "media"),
        "enable_media_repo": False,
        "url_preview_enabled": False,
        "signing_key_path": str(folder / "signing.key"),
        "registration_shared_secret": secret,
        "macaroon_secret_key": secrets.token_urlsafe(32),
        "form_secret": secrets.token_urlsafe(32),
        "enable_registration": False,
        "bcrypt_rounds": 4,
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "enable_metrics": False,
        "presence": {"enabled": presence},
        **limits,
    }


def log_config(log_file: Path) -> dict[str, Any]:
    """Python logging dictConfig: everything at WARNING and above into ``log_file``."""
    return {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_file),
                "formatter": "plain",
            }
        },
        "root": {"level": "WARNING", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


# --- Synapse: install, database, process ------------------------------------------------


def synapse_python(install_dir: Path = INSTALL_DIR) -> Path:
    """The venv's Python with Synapse ``SYNAPSE_VERSION`` in it, made on first use (a
    marker names the installed version; another version is reinstalled)."""
    venv = install_dir / "venv"
    python = venv / "bin" / "python"
    marker = venv / f".installed-{SYNAPSE_VERSION}"
    if marker.exists():
        return python
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    install_dir.mkdir(parents=True, exist_ok=True)
    what = f"matrix-synapse[postgres]=={SYNAPSE_VERSION}"
    with console.status(f"Synapse: creating {venv.relative_to(ROOT)} …") as status:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        proc = subprocess.Popen(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", what],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip()
            if line and not line.startswith("WARNING: Location"):
                tail = [*tail[-20:], line]
                status.update(f"Synapse: installing {what}: [dim]{line[:90]}")
        if proc.wait() != 0:
            console.print("\n".join(tail))
            raise RuntimeError(f"pip install {what} failed")
    marker.write_text(f"installed in {time.monotonic() - t0:.0f} s\n")
    console.print(f"Synapse {SYNAPSE_VERSION} installed in {time.monotonic() - t0:.0f} s")
    return python


async def create_database(pg: EmbeddedPostgres, name: str) -> None:
    """Synapse refuses a database whose collation is not C."""
    conn = await asyncpg.connect(pg.url.replace("postgresql+asyncpg", "postgresql"))
    try:
        await conn.execute(
            f"CREATE DATABASE {name} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        )
    finally:
        await conn.close()


class SynapseServer:
    """Synapse on its own embedded PostgreSQL under ``folder``."""

    def __init__(self, python: Path, folder: Path, *, presence: bool = True) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.pg = start_postgres(folder / "pg", fsync=True)
        asyncio.run(create_database(self.pg, "synapse"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_urlsafe(32)
        pg_args = {
            "user": "postgres",
            "password": self.pg.password,
            "dbname": "synapse",
            "host": "127.0.0.1",
            "port": self.pg.port,
        }
        conf = folder / "homeserver.yaml"
        conf.write_text(
            json.dumps(
                homeserver_config(folder, self.port, pg_args, self.secret, presence=presence)
            )
        )
        conf.chmod(0o600)
        (folder / "log.yaml").write_text(json.dumps(log_config(folder / "homeserver.log")))
        (folder / "signing.key").write_text(signing_key())
        (folder / "media").mkdir(exist_ok=True)
        self.out = open(folder / "stdout.log", "wb")
        self.proc = subprocess.Popen(
            [str(python), "-m", "synapse.app.homeserver", "-c", str(conf)],
            cwd=folder,
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 180) -> None:
        """The first start creates the schema: tens of seconds on this kind of machine."""
        deadline = time.monotonic() + timeout
        with console.status("Synapse: starting (first start creates its schema) …"):
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"Synapse exited: {self.log_tail()}")
                with contextlib.suppress(TransportError):
                    if request_sync("GET", self.url + "/health", timeout=1).status_code == 200:
                        return
                time.sleep(0.2)
        raise TimeoutError(f"Synapse not ready after {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("stdout.log", "homeserver.log"):
            with contextlib.suppress(OSError):
                out += (self.folder / name).read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def procs(self) -> Procs:
        return Procs(tree_roots=[self.proc.pid, self.pg.pid() or 0])

    def parts(self) -> dict[str, Procs]:
        return {
            "synapse": Procs(tree_roots=[self.proc.pid]),
            "postgres": Procs(tree_roots=[self.pg.pid() or 0]),
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()
        self.pg.stop()


# --- Synapse: users, rooms, load ----------------------------------------------------------


@dataclass
class Pair:
    sender_token: str
    receiver_token: str
    receiver_id: str
    room_id: str


@dataclass
class MatrixStats:
    sent: int = 0
    answered: int = 0
    refused: int = 0
    delivered: int = 0
    duplicates: int = 0
    limited_syncs: int = 0
    send_latency: list[float] = field(default_factory=list)
    delivery_latency: list[float] = field(default_factory=list)
    answered_ids: set[str] = field(default_factory=set)
    delivered_ids: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    stopped: float = 0.0

    @property
    def seconds(self) -> float:
        return max(1e-9, self.stopped - self.started)

    def refuse(self, why: str) -> None:
        self.refused += 1
        if len(self.errors) < 100:
            self.errors.append(why)


def client(base: str, token: str | None = None, connections: int = 2) -> HttpPool:
    """HTTP/1.1 with keep-alive, one connection per request in flight."""
    return HttpPool(
        base_url=base,
        headers={"Authorization": f"Bearer {token}"} if token else {},
        max_connections=connections,
        timeout=60.0,
    )


async def register(http: HttpPool, secret: str, user: str) -> tuple[str, str]:
    """(user id, access token) through the shared-secret admin registration."""
    r = await http.get("/_synapse/admin/v1/register")
    r.raise_for_status()
    nonce = r.json()["nonce"]
    r = await http.post(
        "/_synapse/admin/v1/register",
        json={
            "nonce": nonce,
            "username": user,
            "password": PASSWORD,
            "admin": False,
            "mac": registration_mac(secret, nonce, user, PASSWORD, False),
        },
    )
    r.raise_for_status()
    j = r.json()
    return j["user_id"], j["access_token"]


async def make_rooms(base: str, secret: str, n: int) -> list[Pair]:
    """n pairs of users, each with a private room the sender made and the receiver joined."""
    tag = secrets.token_hex(3)
    sem = asyncio.Semaphore(8)
    async with client(base, connections=16) as http:

        async def one(i: int) -> Pair:
            async with sem:
                _, s_tok = await register(http, secret, f"bs{tag}{i}")
                r_id, r_tok = await register(http, secret, f"br{tag}{i}")
                auth = {"Authorization": f"Bearer {s_tok}"}
                r = await http.post(
                    "/_matrix/client/v3/createRoom",
                    headers=auth,
                    json={"preset": "trusted_private_chat", "invite": [r_id], "is_direct": True},
                )
                r.raise_for_status()
                room = r.json()["room_id"]
                r = await http.post(
                    f"/_matrix/client/v3/join/{quote(room, safe='')}",
                    headers={"Authorization": f"Bearer {r_tok}"},
                    json={},
                )
                r.raise_for_status()
                return Pair(s_tok, r_tok, r_id, room)

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def matrix_sender(
    base: str, pair: Pair, tag: str, window: int, size: int, st: MatrixStats, stop: asyncio.Event
) -> None:
    """``window`` loops, each with one send in flight, until ``stop``."""
    path = f"/_matrix/client/v3/rooms/{quote(pair.room_id, safe='')}/send/m.room.message/"
    text = "x" * max(1, size)
    async with client(base, pair.sender_token, connections=window) as http:

        async def loop(k: int) -> None:
            i = 0
            while not stop.is_set():
                txn = f"{tag}-{k}-{i}"
                i += 1
                st.sent += 1
                t0 = time.perf_counter()
                try:
                    r = await http.put(
                        path + txn,
                        json={"msgtype": "m.text", "body": text, "t_us": time.time_ns() // 1000},
                    )
                except TransportError as e:
                    st.refuse(repr(e))
                    await asyncio.sleep(0.1)
                    continue
                if r.status_code == 200:
                    st.answered += 1
                    st.send_latency.append(time.perf_counter() - t0)
                    st.answered_ids.add(r.json()["event_id"])
                else:
                    st.refuse(f"{r.status_code} {r.text[:200]}")
                    await asyncio.sleep(0.1)

        await asyncio.gather(*(loop(k) for k in range(window)))


async def matrix_receiver(base: str, pair: Pair, st: MatrixStats, ready: asyncio.Event) -> None:
    """Long-poll ``/sync`` (``since`` tokens, the filter) and time each message."""
    async with client(base, pair.receiver_token, connections=1) as http:
        r = await http.post(
            f"/_matrix/client/v3/user/{quote(pair.receiver_id, safe='')}/filter",
            json=SYNC_FILTER,
        )
        r.raise_for_status()
        params = {"filter": r.json()["filter_id"], "timeout": "0"}
        r = await http.get("/_matrix/client/v3/sync", params=params)
        r.raise_for_status()
        params["since"] = r.json()["next_batch"]
        params["timeout"] = "30000"
        ready.set()
        while True:
            try:
                r = await http.get("/_matrix/client/v3/sync", params=params)
                r.raise_for_status()
            except TransportError as e:
                if len(st.errors) < 100:
                    st.errors.append(repr(e))
                await asyncio.sleep(0.1)
                continue
            j = r.json()
            now = time.time()
            params["since"] = j["next_batch"]
            for room in j.get("rooms", {}).get("join", {}).values():
                timeline = room.get("timeline", {})
                if timeline.get("limited"):
                    st.limited_syncs += 1
                for ev in timeline.get("events", []):
                    if ev.get("type") != "m.room.message":
                        continue
                    if ev["event_id"] in st.delivered_ids:
                        st.duplicates += 1
                        continue
                    st.delivered_ids.add(ev["event_id"])
                    st.delivered += 1
                    t_us = ev.get("content", {}).get("t_us")
                    if isinstance(t_us, int):
                        st.delivery_latency.append(now - t_us / 1e6)


async def synapse_phase(
    server: SynapseServer, pairs: list[Pair], window: int, duration: float, size: int
) -> tuple[MatrixStats, float, dict[str, float]]:
    """The timed load; returns the stats, the server CPU seconds and those by process."""
    st = MatrixStats()
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in pairs]
    receivers = [
        asyncio.create_task(matrix_receiver(server.url, p, st, ev))
        for p, ev in zip(pairs, readies, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in readies)), 60)
    procs, parts = server.procs(), server.parts()
    cpu0, parts0 = procs.cpu(), {k: v.cpu() for k, v in parts.items()}
    st.started = time.perf_counter()
    senders = [
        asyncio.create_task(matrix_sender(server.url, p, f"s{i}", window, size, st, stop))
        for i, p in enumerate(pairs)
    ]
    await phase_bar("synapse", duration, lambda el: f"{st.answered / max(el, 1e-9):,.0f}/s sent")
    stop.set()
    await asyncio.gather(*senders)
    stopped = time.perf_counter()
    deadline = time.monotonic() + 10  # deliveries of the last sends
    while st.delivered + st.duplicates < st.answered and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    st.stopped = stopped
    cpu = procs.cpu() - cpu0
    by = {k: v.cpu() - parts0[k] for k, v in parts.items()}
    for t in receivers:
        t.cancel()
    await asyncio.gather(*receivers, return_exceptions=True)
    return st, cpu, by


# --- the run -------------------------------------------------------------------------------


def figures(
    *,
    delivered: int,
    seconds: float,
    delivery: list[float],
    send: list[float],
    cpu: float,
    by: dict[str, float],
    lost: int,
    duplicated: int,
    sent: int,
    refused: int,
) -> dict[str, Any]:
    return {
        "sent": sent,
        "refused": refused,
        "delivered": delivered,
        "messages_delivered_per_s": delivered / seconds,
        "delivery_p50_ms": percentile(delivery, 50) * 1000,
        "delivery_p99_ms": percentile(delivery, 99) * 1000,
        "send_p50_ms": percentile(send, 50) * 1000,
        "send_p99_ms": percentile(send, 99) * 1000,
        "server_cpu_s": cpu,
        "server_cores": cpu / seconds,
        "server_cpu_us_per_message": cpu / max(1, delivered) * 1e6,
        "server_cpu_us_per_message_by_process": {
            k: v / max(1, delivered) * 1e6 for k, v in by.items()
        },
        "messages_per_server_cpu_s": delivered / cpu if cpu > 0 else float("nan"),
        "lost": lost,
        "duplicated": duplicated,
    }


def run_synapse(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    python = synapse_python()
    console.print(f"starting PostgreSQL and Synapse {SYNAPSE_VERSION} …")
    t0 = time.monotonic()
    server = SynapseServer(python, tmp / "synapse", presence=not args.no_presence)
    try:
        console.print(f"Synapse ready in {time.monotonic() - t0:.0f} s; making users and rooms …")

        async def go() -> dict[str, Any]:
            pairs = await make_rooms(server.url, server.secret, args.pairs)
            st, cpu, by = await synapse_phase(server, pairs, args.window, args.duration, args.size)
            out = figures(
                delivered=st.delivered,
                seconds=st.seconds,
                delivery=st.delivery_latency,
                send=st.send_latency,
                cpu=cpu,
                by=by,
                lost=len(st.answered_ids - st.delivered_ids),
                duplicated=st.duplicates,
                sent=st.answered,
                refused=st.refused,
            )
            out["limited_syncs"] = st.limited_syncs
            out["errors"] = st.errors[:5]
            out["version"] = SYNAPSE_VERSION
            out["presence"] = not args.no_presence
            return out

        return asyncio.run(go())
    except BaseException:
        console.print(server.log_tail())
        raise
    finally:
        server.stop()


def run_im(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    console.print("starting PostgreSQL, Redis and im-server …")
    (tmp / "im").mkdir(parents=True, exist_ok=True)
    local = Local(tmp / "im")
    try:

        async def go() -> dict[str, Any]:
            pairs = await make_pairs(local.url, args.pairs)
            parts = local.parts()
            parts0 = {k: v.cpu() for k, v in parts.items()}
            st, cpu = await run_phase(
                "im-server",
                local.url,
                pairs,
                args.window,
                args.duration,
                args.size,
                local.im_procs(),
                recv_url=local.recv_url,
            )
            by = {k: v.cpu() - parts0[k] for k, v in parts.items()}
            lost, dup = await verify(local, local.url, st, {})
            out = figures(
                delivered=st.delivered,
                seconds=st.seconds,
                delivery=st.delivery_latency,
                send=st.ack_latency,
                cpu=cpu,
                by=by,
                lost=lost,
                duplicated=dup,
                sent=st.acked,
                refused=st.refused,
            )
            out["errors"] = st.errors[:5]
            return out

        return asyncio.run(go())
    finally:
        local.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="im-bench-synapse-"))
    try:
        res: dict[str, Any] = {
            "pairs": args.pairs,
            "window": args.window,
            "duration_s": args.duration,
            "size": args.size,
            "synapse": run_synapse(args, tmp),
        }
        if not args.synapse_only:
            res["im"] = run_im(args, tmp)
            s, i = res["synapse"], res["im"]
            res["ratio_im_to_synapse"] = {
                "messages_delivered_per_s": i["messages_delivered_per_s"]
                / max(1e-9, s["messages_delivered_per_s"]),
                "messages_per_server_cpu_s": i["messages_per_server_cpu_s"]
                / s["messages_per_server_cpu_s"],
                "server_cpu_per_message": i["server_cpu_us_per_message"]
                / max(1e-9, s["server_cpu_us_per_message"]),
            }
        return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def print_table(res: dict[str, Any]) -> None:
    s = res["synapse"]
    i = res.get("im", {})
    ratio = res.get("ratio_im_to_synapse", {})
    t = Table(
        title=f"one-to-one: {res['pairs']} pairs × window {res['window']}, "
        f"{res['duration_s']:g} s, {res['size']}-byte text"
    )
    t.add_column("figure")
    t.add_column(f"Synapse {s['version']}", justify="right")
    t.add_column("im-server", justify="right")
    t.add_column("im-server / Synapse", justify="right")

    def get(d: dict[str, Any], fmt: str, *keys: str) -> str:
        return fmt.format(*(d[k] for k in keys)) if d else ""

    def by(d: dict[str, Any]) -> str:
        b = d.get("server_cpu_us_per_message_by_process", {})
        return " + ".join(f"{k} {v:,.0f}" for k, v in b.items())

    def r(key: str, fmt: str = "{:,.1f}×") -> str:
        return fmt.format(ratio[key]) if key in ratio else ""

    t.add_row(
        "messages delivered / s",
        get(s, "{:,.0f}", "messages_delivered_per_s"),
        get(i, "{:,.0f}", "messages_delivered_per_s"),
        r("messages_delivered_per_s"),
    )
    t.add_row(
        "delivery p50 / p99",
        get(s, "{:.1f} / {:.1f} ms", "delivery_p50_ms", "delivery_p99_ms"),
        get(i, "{:.1f} / {:.1f} ms", "delivery_p50_ms", "delivery_p99_ms"),
        "",
    )
    t.add_row(
        "send → answer (ack) p50 / p99",
        get(s, "{:.1f} / {:.1f} ms", "send_p50_ms", "send_p99_ms"),
        get(i, "{:.1f} / {:.1f} ms", "send_p50_ms", "send_p99_ms"),
        "",
    )
    t.add_row(
        "server CPU per message",
        get(s, "{:,.0f} µs", "server_cpu_us_per_message"),
        get(i, "{:,.0f} µs", "server_cpu_us_per_message"),
        f"{ratio['server_cpu_per_message']:.4f}× (1/{1 / ratio['server_cpu_per_message']:,.0f})"
        if ratio
        else "",
    )
    t.add_row("  by process (µs)", by(s), by(i), "")
    t.add_row(
        "server cores busy",
        get(s, "{:.2f}", "server_cores"),
        get(i, "{:.2f}", "server_cores"),
        "",
    )
    t.add_row(
        "messages per server CPU-second",
        get(s, "{:,.0f}", "messages_per_server_cpu_s"),
        get(i, "{:,.0f}", "messages_per_server_cpu_s"),
        r("messages_per_server_cpu_s", "{:,.0f}×"),
    )
    t.add_row(
        "sent / lost / duplicated",
        get(s, "{:,} / {} / {}", "sent", "lost", "duplicated"),
        get(i, "{:,} / {} / {}", "sent", "lost", "duplicated"),
        "",
    )
    out = Console()
    if not out.is_terminal:  # a pipe or a file: wide enough for one line per row
        out = Console(width=120)
    out.print(t)
    for name, d in (("Synapse", s), ("im-server", i)):
        if d.get("errors"):
            console.print(f"[yellow]{name} errors (first 5): {d['errors']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench synapse", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--pairs", type=int, default=10, help="one-to-one pairs (sender + receiver)")
    ap.add_argument("--window", type=int, default=4, help="sends in flight per sender")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per server")
    ap.add_argument("--size", type=int, default=60, help="text length of each message")
    ap.add_argument("--synapse-only", action="store_true", help="skip im-server")
    ap.add_argument(
        "--no-presence", action="store_true", help="Synapse with presence off (default: on)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    report(run(args), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
