"""Pictures and files: uploads/s end to end as a client makes them, the server's CPU per
upload next to its CPU per text message, and the time from a picture's send to its
thumbnail, against a real ``im-server serve`` with its own PostgreSQL, Redis and S3
store (SeaweedFS).

    ./scripts/bench uploads [--count 150] [--concurrency 8] [--runs 3] [--images 40]
        [--paced-images 30] [--paced-rate R] [--json]

One upload is what a client does: ``POST /v1/uploads`` (a presigned PUT), the ``PUT`` of
the bytes straight to the S3 store, then a ``send`` of a ``file`` or ``image`` message
naming the upload over the sender's WebSocket; it is done when the ack arrives.
``--concurrency`` uploads are in flight, from one sender to a friend whose WebSocket is
connected (so fan-out is included).

Measured:
* files: per run, ``--count`` text sends (the baseline: the same socket, as many in
  flight), ``--count`` ``POST /v1/uploads`` alone (the server's share before the send),
  ``--count`` uploads of 256 KiB and ``--count`` of 4 MiB (random bytes, each upload
  distinct); a phase ends once its messages are stored. Per second, MiB/s, and CPU per
  upload (per text message) of the server process, of PostgreSQL + Redis and of the S3
  store, from /proc. Each run starts the four one phase further on; medians over
  ``--runs``. The bytes go to the store, not through the server, so the server's CPU
  per upload should not grow with the size.
* pictures: photo-like JPEGs made with Pillow, 2000x1500 (~460 KiB) and 4000x3000 (~1.8
  MiB), each upload distinct (a comment segment holds its tag). For each size:
  - burst: ``--images`` uploads as above; the phase ends once every thumbnail is made,
    seen in ``uploads.thumb_state`` (the row the thumbnail endpoint reads), polled every
    10 ms on the benchmark's own PostgreSQL connection, so the polling sends the server
    nothing. Uploads/s, the time from each ack to its thumbnail (queueing included), CPU
    per picture with its thumbnail;
  - thumbnails alone: the same pictures set back to pending with SQL, the server
    otherwise idle; the worker (in the server process; it reads the picture from the
    store, makes the thumbnail in a thread, stores it) makes them again: thumbnails/s and
    CPU per thumbnail = (CPU over the phase - the idle rate measured just before x the
    phase's length) / pictures; the burst's CPU per picture less this is the upload's;
  - paced: ``--paced-images`` more at half the burst's rate (its pictures over the time
    until its last thumbnail; or ``--paced-rate``); latency from the send's ack to the
    first ``GET /v1/uploads/{id}/thumbnail?redirect=false`` of the receiver that answers
    a URL (polled every 10 ms; the receiver may fetch it once the message is stored and
    the thumbnail made): p50, p99, max.

Checked after the measured phases: every message is stored with its upload; the receiver
downloads every upload through the server's redirect and gets the very bytes sent; every
picture's thumbnail downloads and decodes as a JPEG of 320 px on its longer side.
Failures are counted (refused uploads, refused or lost sends, wrong bytes, missing
thumbnails) and make the exit status 1.

Setup (not measured): the two users and their session are inserted with SQL, they become
friends through the REST API; one text, one file and one picture warm the paths up.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from PIL import Image

from im_server.bench.cluster import ServerProcess, Stores, pg_dsn
from im_server.bench.common import report, run_with_server
from im_server.bench.read_storm import make_users, pct, wait_persisted
from im_server.bench.stack import Procs
from im_server.client import ApiError, Client, Connection, ConnectionLost
from im_server.client.transport import HttpPool, TransportError

KiB = 1024
MiB = 1024 * KiB
FILE_SIZES = {"256KiB": 256 * KiB, "4MiB": 4 * MiB}
PICTURES = {"2000x1500": (2000, 1500), "4000x3000": (4000, 3000)}
POLL = 0.01  # seconds between two looks at a thumbnail's state
THUMB_PX = 320


# --------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of the server process, PostgreSQL + Redis, and the S3 store."""

    server: float
    stores: float
    s3: float

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.server - other.server, self.stores - other.stores, self.s3 - other.s3)

    def scaled(self, k: float) -> Cpu:
        return Cpu(self.server * k, self.stores * k, self.s3 * k)

    def per(self, n: int) -> dict[str, float]:
        """Microseconds per unit, ``n`` units."""
        n = max(n, 1)
        return {
            "server_us": round(self.server * 1e6 / n, 1),
            "stores_us": round(self.stores * 1e6 / n, 1),
            "s3_us": round(self.s3 * 1e6 / n, 1),
        }


@dataclass
class Stack:
    """The server with its stores, and the processes whose CPU is counted."""

    stores: Stores
    server: ServerProcess
    server_procs: Procs = field(init=False)
    store_procs: Procs = field(init=False)
    s3_procs: Procs = field(init=False)

    def __post_init__(self) -> None:
        assert self.server.proc is not None
        self.server_procs = Procs(tree_roots=[self.server.proc.pid])
        self.store_procs = Procs(
            pids=[self.stores.redis.pid() or 0], tree_roots=[self.stores.pg.pid() or 0]
        )
        self.s3_procs = Procs(tree_roots=[self.stores.s3.pid() or 0])

    def cpu(self) -> Cpu:
        return Cpu(self.server_procs.cpu(), self.store_procs.cpu(), self.s3_procs.cpu())


# --------------------------------------------------------------------------- payloads


def photo_jpeg(w: int, h: int) -> bytes:
    """A photo-like JPEG: smooth blotches of colour with grain, so that it compresses
    like a photo (a few bits per pixel), not like a flat colour or pure noise."""
    channels = []
    for sigma in (70, 60, 80):
        coarse = Image.effect_noise((max(2, w // 64), max(2, h // 64)), sigma)
        mid = Image.effect_noise((max(2, w // 8), max(2, h // 8)), 40)
        smooth = Image.blend(
            coarse.resize((w, h), Image.Resampling.BICUBIC),
            mid.resize((w, h), Image.Resampling.BILINEAR),
            0.35,
        )
        channels.append(Image.blend(smooth, Image.effect_noise((w, h), 20), 0.25))
    out = io.BytesIO()
    Image.merge("RGB", channels).save(out, "JPEG", quality=85)
    return out.getvalue()


def tagged_jpeg(base: bytes, tag: bytes) -> bytes:
    """``base`` with a comment segment holding ``tag`` after its start marker: a valid
    JPEG of its own for each upload."""
    return base[:2] + b"\xff\xfe" + (len(tag) + 2).to_bytes(2, "big") + tag + base[2:]


@dataclass(frozen=True)
class Kind:
    """What is uploaded: a file of random bytes, or a picture."""

    name: str
    base: bytes
    mime: str
    content_type: str  # of the message: file | image
    filename: str

    def payload(self, tag: bytes) -> bytes:
        if self.content_type == "image":
            return tagged_jpeg(self.base, tag)
        return tag + self.base[len(tag) :]


@dataclass
class Sent:
    """One upload whose send was acked."""

    kind: Kind
    tag: bytes
    upload_id: str
    seq: int
    acked_at: float  # time.time()
    upload_ms: float  # POST + PUT
    send_ms: float  # send -> ack


# --------------------------------------------------------------------------- the client


@dataclass
class Bench:
    args: argparse.Namespace
    stack: Stack
    pg: asyncpg.Connection
    watch_pg: asyncpg.Connection  # the thumbnail watcher's own (no concurrent use)
    conv: str
    sender: Client
    receiver: Client
    sock: Connection
    sent: list[Sent] = field(default_factory=list)
    fails: Counter[str] = field(default_factory=Counter)
    last_seq: int = 0

    def note_seq(self, seq: int) -> None:
        self.last_seq = max(self.last_seq, seq)


async def pool(n: int, concurrency: int, job: Callable[[int], Awaitable[None]]) -> None:
    """Run job(0..n-1), at most ``concurrency`` at a time."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await job(i)

    await asyncio.gather(*(worker() for _ in range(min(n, concurrency))))


async def send_text(b: Bench, tag: str) -> bool:
    try:
        ack = await b.sock.send(b.conv, {"text": f"text {tag}"}, client_msg_id=tag, timeout=30)
    except (TimeoutError, ConnectionLost):
        b.fails["send_lost"] += 1
        return False
    if not ack.get("ok"):
        b.fails["send_refused"] += 1
        return False
    b.note_seq(int(ack["seq"]))
    return True


async def upload_one(b: Bench, kind: Kind, cmid: str) -> Sent | None:
    """POST, PUT, send; the acked upload, or None (counted in ``b.fails``)."""
    tag = uuid.uuid4().bytes
    data = kind.payload(tag)
    t0 = time.perf_counter()
    try:
        upload_id = await b.sender.upload(data, kind.mime, kind.filename)
    except (ApiError, TransportError):
        b.fails["upload_refused"] += 1
        return None
    t1 = time.perf_counter()
    try:
        ack = await b.sock.send(
            b.conv, {"upload_id": upload_id}, kind.content_type, client_msg_id=cmid, timeout=30
        )
    except (TimeoutError, ConnectionLost):
        b.fails["send_lost"] += 1
        return None
    t2 = time.perf_counter()
    if not ack.get("ok"):
        b.fails["send_refused"] += 1
        return None
    seq = int(ack["seq"])
    b.note_seq(seq)
    s = Sent(kind, tag, upload_id, seq, time.time(), (t1 - t0) * 1000, (t2 - t1) * 1000)
    b.sent.append(s)
    return s


# --------------------------------------------------------------------------- thumbnails


class ThumbWatch:
    """Polls ``uploads.thumb_state`` of the pictures whose thumbnail is not made yet, on
    the benchmark's own connection: when each became done (or failed)."""

    def __init__(self, pg: asyncpg.Connection) -> None:
        self.pg = pg
        self.waiting: dict[str, asyncio.Event] = {}
        self.seen: dict[str, asyncio.Event] = {}
        self.done_at: dict[str, float] = {}
        self.failed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, upload_id: str) -> None:
        self.waiting[upload_id] = self.seen[upload_id] = asyncio.Event()

    async def poll_once(self, ids: list[str]) -> None:
        rows = await self.pg.fetch(
            "SELECT upload_id, thumb_state FROM uploads "
            "WHERE upload_id = ANY($1::text[]) AND thumb_state <> 'pending'",
            ids,
        )
        now = time.time()
        for r in rows:
            up = str(r["upload_id"])
            ev = self.waiting.pop(up, None)
            if ev is not None:
                self.done_at[up] = now
                if r["thumb_state"] != "done":
                    self.failed.add(up)
                ev.set()

    async def _run(self) -> None:
        while True:
            if self.waiting:
                await self.poll_once(list(self.waiting))
            await asyncio.sleep(POLL)

    def start(self) -> ThumbWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def wait_all(self, timeout: float) -> None:
        """Until every picture added so far is seen made (or failed)."""
        events = [ev.wait() for ev in self.seen.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*events), timeout)
        except TimeoutError:
            raise TimeoutError(f"{len(self.waiting)} thumbnails not made in {timeout} s") from None

    async def wait_one(self, upload_id: str, timeout: float) -> bool:
        """Whether its thumbnail was seen made (or failed) within ``timeout``."""
        try:
            await asyncio.wait_for(self.seen[upload_id].wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


async def peer_thumbnail(b: Bench, upload_id: str, timeout: float = 60) -> float | None:
    """Poll the receiver's ``GET /v1/uploads/{id}/thumbnail?redirect=false`` until it
    answers a URL; time.time() then, or None (counted)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await b.receiver.request(
                "GET", f"/v1/uploads/{upload_id}/thumbnail", params={"redirect": "false"}
            )
            return time.time()
        except ApiError as e:
            if e.status != 404:
                b.fails["thumbnail_refused"] += 1
                return None
        if time.monotonic() > deadline:
            b.fails["thumbnail_timeout"] += 1
            return None
        await asyncio.sleep(POLL)


# --------------------------------------------------------------------------- phases


def ms_stats(values: list[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p50_ms": None, f"{prefix}_p99_ms": None, f"{prefix}_max_ms": None}
    return {
        f"{prefix}_p50_ms": round(pct(values, 50), 1),
        f"{prefix}_p99_ms": round(pct(values, 99), 1),
        f"{prefix}_max_ms": round(max(values), 1),
    }


async def text_phase(b: Bench, n: int, tag: str) -> dict[str, Any]:
    oks: list[bool] = []

    async def job(i: int) -> None:
        oks.append(await send_text(b, f"{tag}-{i}"))

    cpu0 = b.stack.cpu()
    t0 = time.perf_counter()
    await pool(n, b.args.concurrency, job)
    wall = time.perf_counter() - t0
    await wait_persisted(b.pg, b.conv, b.last_seq)
    cpu = b.stack.cpu() - cpu0
    ok = sum(oks)
    return {"count": n, "ok": ok, "per_s": round(ok / wall, 1), **cpu.per(ok)}


async def ticket_phase(b: Bench, n: int) -> dict[str, Any]:
    """``POST /v1/uploads`` alone (nothing PUT, nothing sent): the server's part of an
    upload before the send. The rows are left to the clean-up."""
    oks: list[bool] = []
    body = {"content_type": "application/octet-stream", "size": 4 * MiB, "filename": "t.bin"}

    async def job(i: int) -> None:
        try:
            await b.sender.request("POST", "/v1/uploads", json=body)
            oks.append(True)
        except (ApiError, TransportError):
            b.fails["upload_refused"] += 1

    cpu0 = b.stack.cpu()
    t0 = time.perf_counter()
    await pool(n, b.args.concurrency, job)
    wall = time.perf_counter() - t0
    cpu = b.stack.cpu() - cpu0
    ok = len(oks)
    return {"count": n, "ok": ok, "per_s": round(ok / wall, 1), **cpu.per(ok)}


async def upload_phase(b: Bench, kind: Kind, n: int, tag: str) -> dict[str, Any]:
    done: list[Sent] = []

    async def job(i: int) -> None:
        s = await upload_one(b, kind, f"{tag}-{i}")
        if s is not None:
            done.append(s)

    cpu0 = b.stack.cpu()
    t0 = time.perf_counter()
    await pool(n, b.args.concurrency, job)
    wall = time.perf_counter() - t0
    await wait_persisted(b.pg, b.conv, b.last_seq)
    cpu = b.stack.cpu() - cpu0
    ok = len(done)
    return {
        "count": n,
        "ok": ok,
        "per_s": round(ok / wall, 1),
        "mib_per_s": round(ok * len(kind.base) / MiB / wall, 1),
        **cpu.per(ok),
        **ms_stats([s.upload_ms for s in done], "post_put"),
        **ms_stats([s.send_ms for s in done], "send_ack"),
    }


async def files(b: Bench, kinds: dict[str, Kind]) -> dict[str, Any]:
    """Runs of text, 256 KiB and 4 MiB uploads, the order turned each run."""
    order = ["text", "post", *kinds]
    runs: list[dict[str, Any]] = []
    for r in range(b.args.runs):
        run: dict[str, Any] = {}
        turned = order[r % len(order) :] + order[: r % len(order)]
        for what in turned:
            tag = f"run{r}-{what}"
            if what == "text":
                run[what] = await text_phase(b, b.args.count, tag)
            elif what == "post":
                run[what] = await ticket_phase(b, b.args.count)
            else:
                run[what] = await upload_phase(b, kinds[what], b.args.count, tag)
        runs.append(run)
    keys = ("per_s", "server_us", "stores_us", "s3_us")
    med = {w: {k: round(statistics.median(x[w][k] for x in runs), 1) for k in keys} for w in order}
    text_us = med["text"]["server_us"]
    return {
        "runs": runs,
        "median": med,
        "server_ratio_to_text": {
            w: round(med[w]["server_us"] / text_us, 2) if text_us else None for w in order
        },
        "server_ratio_4MiB_to_256KiB": round(
            med["4MiB"]["server_us"] / med["256KiB"]["server_us"], 3
        )
        if med["256KiB"]["server_us"]
        else None,
    }


async def image_burst(b: Bench, kind: Kind, n: int) -> tuple[dict[str, Any], list[Sent]]:
    watch = ThumbWatch(b.watch_pg).start()
    done: list[Sent] = []

    async def job(i: int) -> None:
        s = await upload_one(b, kind, f"burst-{kind.name}-{i}")
        if s is not None:
            watch.add(s.upload_id)
            done.append(s)

    try:
        cpu0 = b.stack.cpu()
        t0 = time.perf_counter()
        t0_wall = time.time()
        await pool(n, b.args.concurrency, job)
        wall = time.perf_counter() - t0
        await wait_persisted(b.pg, b.conv, b.last_seq)
        await watch.wait_all(60 + 2 * n)
        cpu = b.stack.cpu() - cpu0
    finally:
        await watch.stop()
    b.fails["thumbnail_failed"] += len(watch.failed)
    ok = len(done)
    lat = [(watch.done_at[s.upload_id] - s.acked_at) * 1000 for s in done]
    last = max(watch.done_at.values(), default=t0_wall)
    return {
        "count": n,
        "ok": ok,
        "thumbnails_failed": len(watch.failed),
        "per_s": round(ok / wall, 1),
        "all_thumbnails_s": round(last - t0_wall, 2),
        **ms_stats(lat, "ack_to_thumb"),
        **cpu.per(ok),
        **ms_stats([s.upload_ms for s in done], "post_put"),
        **ms_stats([s.send_ms for s in done], "send_ack"),
    }, done


async def thumbnails_alone(b: Bench, done: list[Sent]) -> dict[str, Any]:
    """Set the pictures' thumbnails back to pending and let the worker make them again,
    the server otherwise idle; the idle rate just before is taken off."""
    ids = [s.upload_id for s in done]
    watch = ThumbWatch(b.watch_pg)
    c0, t0 = b.stack.cpu(), time.perf_counter()
    while time.perf_counter() - t0 < b.args.idle_seconds:  # the same polling, nothing to do
        await watch.poll_once(ids)
        await asyncio.sleep(POLL)
    idle_s = time.perf_counter() - t0
    idle = (b.stack.cpu() - c0).scaled(1 / idle_s)
    for up in ids:
        watch.add(up)
    cpu0 = b.stack.cpu()
    t0 = time.perf_counter()
    reset_at = time.time()
    await b.pg.execute(
        "UPDATE uploads SET thumb_state = 'pending', thumb_lease_until = 0 "
        "WHERE upload_id = ANY($1::text[])",
        ids,
    )
    watch.start()  # only now: before, it would see them done from the last time
    try:
        await watch.wait_all(60 + 2 * len(ids))
        span = time.perf_counter() - t0
        cpu = b.stack.cpu() - cpu0 - idle.scaled(span)
    finally:
        await watch.stop()
    b.fails["thumbnail_failed"] += len(watch.failed)
    times = sorted(watch.done_at.values())
    n = len(ids)
    per_s = (n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else None
    return {
        "count": n,
        "failed": len(watch.failed),
        "first_after_s": round(times[0] - reset_at, 2),
        "thumbnails_per_s": round(per_s, 1) if per_s else None,
        "idle_server_cpu_pct": round(idle.server * 100, 2),
        **cpu.per(n),
    }


async def image_paced(b: Bench, kind: Kind, n: int, rate: float) -> dict[str, Any]:
    lat: list[float] = []
    made: list[float] = []
    watch = ThumbWatch(b.watch_pg).start()
    wall0 = time.monotonic()

    async def one(i: int) -> None:
        s = await upload_one(b, kind, f"paced-{kind.name}-{i}")
        if s is None:
            return
        watch.add(s.upload_id)
        at = await peer_thumbnail(b, s.upload_id)
        if at is not None:
            lat.append((at - s.acked_at) * 1000)
        if await watch.wait_one(s.upload_id, 30):
            made.append((watch.done_at[s.upload_id] - s.acked_at) * 1000)

    try:
        tasks = []
        for i in range(n):
            delay = wall0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    finally:
        await watch.stop()
    b.fails["thumbnail_failed"] += len(watch.failed)
    return {
        "count": n,
        "rate_per_s": round(rate, 2),
        "ok": len(lat),
        **ms_stats(lat, "latency"),
        **ms_stats(made, "ack_to_thumb"),
    }


async def images(b: Bench, kinds: dict[str, Kind]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        burst, done = await image_burst(b, kind, b.args.images)
        alone = await thumbnails_alone(b, done) if done else {}
        # what the server did with uploads and thumbnails both at work: the burst's
        # pictures over the time until their last thumbnail
        capacity = burst["ok"] / max(burst["all_thumbnails_s"], 0.01)
        rate = b.args.paced_rate or max(capacity / 2, 0.5)
        paced = await image_paced(b, kind, b.args.paced_images, rate)
        out[name] = {
            "bytes": len(kind.base),
            "burst": burst,
            "thumbnails_alone": alone,
            "paced": paced,
            # the server's CPU per picture without its thumbnail: burst minus thumbnail
            "upload_server_us": round(burst["server_us"] - alone["server_us"], 1)
            if alone
            else None,
        }
    return out


# --------------------------------------------------------------------------- checks


async def verify(b: Bench) -> dict[str, int]:
    """Every acked upload is stored with its message, downloads to the very bytes sent
    (the receiver, through the server's redirect), and every picture has a thumbnail."""
    await wait_persisted(b.pg, b.conv, b.last_seq)
    stored = await b.pg.fetchval(
        "SELECT count(*) FROM message_uploads WHERE conv_id = $1 AND upload_id = ANY($2::text[])",
        b.conv,
        [s.upload_id for s in b.sent],
    )
    bad: Counter[str] = Counter()
    bad["not_stored"] = len(b.sent) - int(stored)

    async def check(i: int) -> None:
        s = b.sent[i]
        try:
            data = await b.receiver.download(s.upload_id)
        except (ApiError, TransportError):
            bad["download_failed"] += 1
            return
        if data != s.kind.payload(s.tag):
            bad["wrong_bytes"] += 1
        if s.kind.content_type != "image":
            return
        try:
            thumb = await b.receiver.download(s.upload_id, thumbnail=True)
            with Image.open(io.BytesIO(thumb)) as img:
                if img.format != "JPEG" or max(img.size) != THUMB_PX:
                    bad["bad_thumbnail"] += 1
        except (ApiError, TransportError, OSError):
            bad["bad_thumbnail"] += 1

    await pool(len(b.sent), 8, check)
    return {
        "uploads": len(b.sent),
        "pictures": sum(s.kind.content_type == "image" for s in b.sent),
        **{k: v for k, v in sorted((b.fails + bad).items())},
    }


# --------------------------------------------------------------------------- main


async def setup(args: argparse.Namespace, stack: Stack, pg: asyncpg.Connection) -> Bench:
    run = uuid.uuid4().hex[:8]
    (a, ta), (r, tr) = await make_users(pg, 2, run)
    http = HttpPool(timeout=60, max_connections=4 * args.concurrency + 8)
    sender = Client(stack.server.url, ta, user_id=a, http=http)
    receiver = Client(stack.server.url, tr, user_id=r, http=http)
    conv = await receiver.accept_friend(await sender.request_friend(r))
    await receiver.connect(queue_events=False)
    sock = await sender.connect(queue_events=False)
    watch_pg = await asyncpg.connect(pg_dsn(stack.stores))
    return Bench(args, stack, pg, watch_pg, conv, sender, receiver, sock)


async def bench(args: argparse.Namespace, stores: Stores, server: ServerProcess) -> dict[str, Any]:
    load_start = round(os.getloadavg()[0], 2)
    stack = Stack(stores, server)
    file_kinds = {
        name: Kind(name, os.urandom(size), "application/octet-stream", "file", f"{name}.bin")
        for name, size in FILE_SIZES.items()
    }
    picture_kinds = {
        name: Kind(name, photo_jpeg(w, h), "image/jpeg", "image", f"{name}.jpg")
        for name, (w, h) in PICTURES.items()
    }
    pg = await asyncpg.connect(pg_dsn(stores))
    b = await setup(args, stack, pg)
    try:
        # warm up: token cache, seq block, the store's connections, Pillow, the worker
        await send_text(b, "warm")
        await upload_one(b, file_kinds["256KiB"], "warm-file")
        warm = await upload_one(b, picture_kinds["2000x1500"], "warm-picture")
        if warm is not None:
            await peer_thumbnail(b, warm.upload_id)
        t0 = time.perf_counter()
        fl = await files(b, file_kinds)
        t1 = time.perf_counter()
        im = await images(b, picture_kinds)
        t2 = time.perf_counter()
        checks = await verify(b)
        took = {
            "files": round(t1 - t0, 1),
            "pictures": round(t2 - t1, 1),
            "checks": round(time.perf_counter() - t2, 1),
        }
    finally:
        await b.sender.aclose()
        await b.receiver.aclose()
        await b.sender.http.aclose()
        await b.watch_pg.close()
        await pg.close()
    return {
        "benchmark": "uploads",
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_1m_start": load_start,
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        },
        "params": {
            "count": args.count,
            "concurrency": args.concurrency,
            "runs": args.runs,
            "images": args.images,
            "paced_images": args.paced_images,
        },
        "seconds": took,
        "files": fl,
        "images": im,
        "checks": checks,
        "ok": not any(v for k, v in checks.items() if k not in ("uploads", "pictures")),
    }


def print_table(res: dict[str, Any]) -> None:
    p, m, fl = res["params"], res["machine"], res["files"]
    print(
        f"uploads: one sender, {p['concurrency']} in flight, to a connected friend; "
        f"{m['cpus']} CPUs, load {m['loadavg_1m_start']} -> {m['loadavg_1m_end']}"
    )
    print(
        f"files, {p['count']} of each per run, median of {p['runs']} runs "
        "(CPU per message; an upload is POST + PUT + send; post: POST alone):"
    )
    print(
        f"{'':10} {'per s':>8} {'server':>10} {'PG+Redis':>10} {'S3 store':>10} {'server/text':>12}"
    )
    for what, x in fl["median"].items():
        ratio = fl["server_ratio_to_text"].get(what)
        print(
            f"{what:10} {x['per_s']:>8} {x['server_us']:>7} µs {x['stores_us']:>7} µs "
            f"{x['s3_us']:>7} µs {'' if ratio is None else ratio:>12}"
        )
    print(f"server CPU per upload, 4 MiB / 256 KiB: {fl['server_ratio_4MiB_to_256KiB']}")
    for name, x in res["images"].items():
        bu, al, pa = x["burst"], x["thumbnails_alone"], x["paced"]
        print(f"pictures {name} JPEG, {x['bytes'] // KiB} KiB:")
        print(
            f"  burst, {bu['ok']}/{bu['count']}: {bu['per_s']} uploads/s, all thumbnails "
            f"{bu['all_thumbnails_s']} s after the first; ack -> thumbnail p50/p99/max "
            f"{bu['ack_to_thumb_p50_ms']}/{bu['ack_to_thumb_p99_ms']}/{bu['ack_to_thumb_max_ms']}"
            f" ms; CPU per picture with its thumbnail: server {bu['server_us']} µs, "
            f"PG+Redis {bu['stores_us']} µs, S3 {bu['s3_us']} µs"
        )
        if al:
            print(
                f"  thumbnails alone, {al['count']}: {al['thumbnails_per_s']}/s; CPU per "
                f"thumbnail: server {al['server_us']} µs, PG+Redis {al['stores_us']} µs, "
                f"S3 {al['s3_us']} µs (idle server {al['idle_server_cpu_pct']} % taken off); "
                f"so the server's CPU per picture without its thumbnail: "
                f"{x['upload_server_us']} µs"
            )
        print(
            f"  paced, {pa['ok']}/{pa['count']} at {pa['rate_per_s']}/s: ack -> receiver's "
            f"thumbnail p50/p99/max {pa['latency_p50_ms']}/{pa['latency_p99_ms']}/"
            f"{pa['latency_max_ms']} ms (made: {pa['ack_to_thumb_p50_ms']}/"
            f"{pa['ack_to_thumb_p99_ms']}/{pa['ack_to_thumb_max_ms']} ms)"
        )
    c = res["checks"]
    print(
        "checks: "
        + ", ".join(f"{k} {v}" for k, v in c.items())
        + ("  (ok)" if res["ok"] else "  (FAILURES)")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench uploads", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--count", type=int, default=150, help="text sends, and uploads of each size, per run"
    )
    ap.add_argument("--concurrency", type=int, default=8, help="uploads (sends) in flight")
    ap.add_argument("--runs", type=int, default=3, help="runs of the file phases")
    ap.add_argument("--images", type=int, default=40, help="pictures of each size, burst")
    ap.add_argument("--paced-images", type=int, default=30, help="pictures of each size, paced")
    ap.add_argument(
        "--paced-rate",
        type=float,
        default=0.0,
        help="pictures/s paced (default: half the capacity)",
    )
    ap.add_argument("--idle-seconds", type=float, default=3.0, help="idle rate measured over this")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    res = run_with_server("im-uploads-", lambda st, srv: bench(args, st, srv))
    report(res, args.json, print_table)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
