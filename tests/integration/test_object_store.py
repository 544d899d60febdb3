"""The object store client on the embedded SeaweedFS the suite starts, and that store's
own supervision: keys, refusals, presigned URLs, restart, leftovers, secrets."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from im_server.client.transport import HttpPool, TransportError, request_sync
from im_server.config import Settings, load_settings
from im_server.errors import is_store_error
from im_server.runtime.embedded import (
    CREDENTIALS_FILE,
    EmbeddedS3,
    free_port,
    read_credentials,
    start_s3,
)
from im_server.runtime.s3_config import PORTS_FILE
from im_server.runtime.s3_server import volumes_known
from im_server.storage.objects import (
    ObjectInfo,
    ObjectStore,
    ObjectStoreUnavailable,
    ObjectTooLarge,
    content_disposition,
)
from tests.support import ServerProcess, Stores


def s3_settings(s3: EmbeddedS3, bucket: str, **extra: object) -> Settings:
    given: dict[str, object] = {
        "s3_endpoint": s3.endpoint,
        "s3_access_key": s3.access_key,
        "s3_secret_key": s3.secret_key,
        "s3_region": s3.region,
        "s3_bucket": bucket,
    }
    return load_settings(**{**given, **extra})


def new_bucket() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def objects(stores: Stores) -> AsyncIterator[ObjectStore]:
    store = await ObjectStore.open(s3_settings(stores.s3, new_bucket()))
    try:
        await store.ensure_bucket()
        yield store
    finally:
        await store.close()


@pytest.fixture
def stoppers() -> Iterator[list[Callable[[], None]]]:
    fns: list[Callable[[], None]] = []
    yield fns
    for fn in reversed(fns):
        with contextlib.suppress(Exception):  # best-effort cleanup
            fn()


def weeds_in(folder: Path) -> list[int]:
    """Live weed processes working in ``folder``."""
    found = []
    for p in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error, OSError):
            if p.info["name"] == "weed" and p.status() != psutil.STATUS_ZOMBIE:
                if os.path.samefile(p.cwd(), folder):
                    found.append(p.pid)
    return found


# --------------------------------------------------------------------------- the client


async def test_ensure_bucket_is_idempotent(stores: Stores) -> None:
    async with ObjectStore(s3_settings(stores.s3, new_bucket())) as store:
        await store.ensure_bucket()
        await store.ensure_bucket()
        await store.put("k", b"x", "text/plain")
        await store.ensure_bucket()  # a bucket with objects in it is fine too
        assert await store.head("k") == ObjectInfo(1, "text/plain")


PAGE_ORIGIN = "http://chat.example:8000"


async def test_bucket_answers_browser_preflights(objects: ObjectStore) -> None:
    """The web client PUTs and GETs presigned URLs from its own origin: the bucket has
    CORS rules, preflights are allowed, and the answers expose ETag to the page."""
    rules = await objects.client.get_bucket_cors(Bucket=objects.bucket)
    assert rules["CORSRules"][0]["AllowedOrigins"] == ["*"]
    data = b"\x89PNG...."
    url, headers = await objects.presign_put("up/cors.png", "image/png", len(data), 60)
    ask = {"Origin": PAGE_ORIGIN, "Access-Control-Request-Headers": "content-type"}
    async with HttpPool() as http:
        for method, target in (("PUT", url), ("GET", await objects.presign_get("up/cors.png", 60))):
            r = await http.options(target, headers={**ask, "Access-Control-Request-Method": method})
            assert r.status_code in (200, 204), r.text
            assert r.headers["access-control-allow-origin"] in (PAGE_ORIGIN, "*")
            assert method in r.headers["access-control-allow-methods"]
            assert "content-type" in r.headers["access-control-allow-headers"].lower()
        put = await http.put(url, content=data, headers={**headers, "Origin": PAGE_ORIGIN})
        assert put.status_code == 200, put.text
        assert put.headers["access-control-allow-origin"] in (PAGE_ORIGIN, "*")
        assert "etag" in put.headers["access-control-expose-headers"].lower()


async def test_operator_cors_rules_stay(stores: Stores) -> None:
    async with ObjectStore(s3_settings(stores.s3, new_bucket())) as store:
        await store.ensure_bucket()
        mine = [{"AllowedOrigins": [PAGE_ORIGIN], "AllowedMethods": ["GET"]}]
        await store.client.put_bucket_cors(
            Bucket=store.bucket, CORSConfiguration={"CORSRules": mine}
        )
        await store.ensure_bucket()
        rules = (await store.client.get_bucket_cors(Bucket=store.bucket))["CORSRules"]
        assert [r["AllowedOrigins"] for r in rules] == [[PAGE_ORIGIN]]


async def test_presigned_put_then_head_and_get(objects: ObjectStore) -> None:
    data = os.urandom(3000)
    url, headers = await objects.presign_put("up/a.png", "image/png", len(data), 60)
    assert headers == {"Content-Type": "image/png", "Content-Length": "3000"}
    async with HttpPool() as http:
        r = await http.put(url, content=data, headers=headers)
        assert r.status_code == 200, r.text
        assert await objects.head("up/a.png") == ObjectInfo(3000, "image/png")
        assert await objects.head("up/none") is None

        name = 'Grüße "x".png'
        got = await http.get(await objects.presign_get("up/a.png", 60, filename=name))
        assert got.status_code == 200 and got.content == data
        assert got.headers["content-disposition"] == content_disposition(name)
        assert "filename*=UTF-8''Gr%C3%BC%C3%9Fe%20%22x%22.png" in content_disposition(name)
        typed = await http.get(
            await objects.presign_get("up/a.png", 60, content_type="application/octet-stream")
        )
        assert typed.headers["content-type"] == "application/octet-stream"
    assert await objects.get_range("up/a.png", 10, 19) == data[10:20]
    assert await objects.get("up/a.png", 3000) == data


async def test_put_must_match_what_was_signed(objects: ObjectStore) -> None:
    url, headers = await objects.presign_put("up/b", "image/png", 10, 60)
    async with HttpPool() as http:
        longer = await http.put(url, content=b"x" * 11, headers={"Content-Type": "image/png"})
        assert longer.status_code == 403
        other_type = {**headers, "Content-Type": "text/html"}
        html = await http.put(url, content=b"x" * 10, headers=other_type)
        assert html.status_code == 403
        assert await objects.head("up/b") is None
        ok = await http.put(url, content=b"x" * 10, headers=headers)
        assert ok.status_code == 200


async def test_unsigned_requests_are_refused(objects: ObjectStore, stores: Stores) -> None:
    await objects.put("secret-doc", b"private", "text/plain")
    where = f"{stores.s3.endpoint}/{objects.bucket}"
    async with HttpPool() as http:
        assert (await http.get(f"{where}/secret-doc")).status_code == 403
        assert (await http.put(f"{where}/new", content=b"x")).status_code == 403
        assert (await http.get(f"{where}/")).status_code == 403  # listing
        assert (await http.get(stores.s3.endpoint + "/")).status_code == 403
    assert await objects.head("new") is None


async def test_expired_urls_are_refused(objects: ObjectStore) -> None:
    await objects.put("old", b"data", "text/plain")
    put_url, headers = await objects.presign_put("late", "text/plain", 4, 1)
    get_url = await objects.presign_get("old", 1)
    await asyncio.sleep(2.1)  # the URLs were signed to live 1 s
    async with HttpPool() as http:
        assert (await http.put(put_url, content=b"data", headers=headers)).status_code == 403
        assert (await http.get(get_url)).status_code == 403
    assert await objects.head("late") is None


async def test_delete_in_batches_missing_keys_fine(objects: ObjectStore) -> None:
    keys = [f"d/{i}" for i in range(5)]
    for k in keys:
        await objects.put(k, b"x", "text/plain")
    await objects.delete([*keys[:3], "d/never-there"])
    assert [await objects.head(k) is None for k in keys] == [True, True, True, False, False]
    await objects.delete([])
    await objects.delete([f"d/{i}" for i in range(1500)])  # two DeleteObjects calls
    assert await objects.head("d/4") is None


async def test_get_refuses_larger_objects(objects: ObjectStore) -> None:
    await objects.put("big", b"y" * 100, "application/octet-stream")
    with pytest.raises(ObjectTooLarge):
        await objects.get("big", 99)
    assert await objects.get("big", 100) == b"y" * 100


async def test_get_reads_a_large_object_whole(objects: ObjectStore) -> None:
    """A body arrives in pieces: ``get`` must read to the end, not take the first."""
    data = os.urandom(5 * 1024 * 1024 + 7)
    key = f"t/{uuid.uuid4().hex}"
    await objects.put(key, data, "application/octet-stream")
    assert await objects.get(key, len(data)) == data
    with pytest.raises(ObjectTooLarge):
        await objects.get(key, len(data) - 1)


async def test_public_endpoint_is_in_presigned_urls(stores: Stores) -> None:
    """Clients get the public address, signed for it: a proxy that forwards the request
    unchanged (Host included) to the store gets it accepted."""
    public = "http://files.example.test:9000"
    settings = s3_settings(stores.s3, new_bucket(), s3_public_endpoint=public)
    async with ObjectStore(settings) as store:
        await store.ensure_bucket()
        url, headers = await store.presign_put("p", "text/plain", 2, 60)
        get_url = await store.presign_get("p", 60)
        assert url.startswith(public + f"/{store.bucket}/p?")
        assert get_url.startswith(public + "/")
        # what the proxy does: same path and query, same Host, to the store itself
        parts = urlsplit(url)
        inside = f"{stores.s3.endpoint}{parts.path}?{parts.query}"
        async with HttpPool() as http:
            r = await http.put(inside, content=b"hi", headers={**headers, "Host": parts.netloc})
            assert r.status_code == 200, r.text
            plain = await http.put(inside, content=b"hi", headers=headers)
            assert plain.status_code == 403  # signed for the public host, not this one
        assert await store.head("p") == ObjectInfo(2, "text/plain")


async def test_embedded_store_knows_the_public_address(
    tmp_path: Path, stoppers: list[Callable[[], None]]
) -> None:
    """Started with the public endpoint (as ``serve`` does), the embedded store accepts a
    presigned request a proxy forwards with its own Host header."""
    public = "http://files.example.test:9000"
    s3 = await asyncio.to_thread(start_s3, tmp_path / "s3", external_url=public)
    stoppers.append(s3.stop)
    async with ObjectStore(s3_settings(s3, "pub", s3_public_endpoint=public)) as store:
        await store.ensure_bucket()
        url, headers = await store.presign_put("p", "text/plain", 2, 60)
        parts = urlsplit(url)
        async with HttpPool() as http:
            r = await http.put(
                f"{s3.endpoint}{parts.path}?{parts.query}", content=b"hi", headers=headers
            )
            assert r.status_code == 200, r.text
        assert await store.head("p") == ObjectInfo(2, "text/plain")


async def test_store_down_is_a_store_error(stores: Stores) -> None:
    settings = s3_settings(stores.s3, "b", s3_endpoint=f"http://127.0.0.1:{free_port()}")
    settings = settings.model_copy(update={"store_timeout_seconds": 1.0})
    async with ObjectStore(settings) as store:
        for call in (store.head("k"), store.put("k", b"x", "text/plain"), store.ensure_bucket()):
            with pytest.raises(ObjectStoreUnavailable) as info:
                await call
            assert is_store_error(info.value)


# --------------------------------------------------------------------------- the embedded store


def test_restart_keeps_keys_and_objects(
    tmp_path: Path, stoppers: list[Callable[[], None]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "im_server")
    s3 = start_s3(tmp_path / "s3")
    stoppers.append(s3.stop)
    folder = tmp_path / "s3"
    creds = folder / CREDENTIALS_FILE
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "s3.json").stat().st_mode) == 0o600
    assert read_credentials(folder).secret_key == s3.secret_key
    assert s3.secret_key not in repr(s3) and s3.secret_key not in s3.display

    async def put_and_get(store: EmbeddedS3, write: bool) -> bytes:
        async with ObjectStore(s3_settings(store, "keep")) as objs:
            if write:
                await objs.ensure_bucket()
                await objs.put("k", b"kept", "text/plain")
            return await objs.get("k", 100)

    assert asyncio.run(put_and_get(s3, True)) == b"kept"
    pid = s3.pid()
    assert pid is not None
    s3.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert weeds_in(folder) == []

    again = start_s3(folder)
    stoppers.append(again.stop)
    assert (again.access_key, again.secret_key) == (s3.access_key, s3.secret_key)
    assert again.port == s3.port  # the previous ports, still free
    # ready means the master knows the volumes already on disk (else a read answers 500)
    master_port = json.loads((folder / PORTS_FILE).read_text())["master.port"]
    assert (
        (volumes_known(master_port, again.internal_tls()) or 0)
        >= len(list((folder / "data").glob("*.dat")))
        >= 1
    )
    assert asyncio.run(put_and_get(again, False)) == b"kept"
    again.stop()
    assert weeds_in(folder) == []
    open_ = [str(p) for p in folder.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert open_ == []

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "s3: clean start" in logged
    assert s3.secret_key not in logged
    assert s3.secret_key not in (folder / "weed.log").read_text(errors="replace")


def test_leftover_of_a_previous_run_is_stopped(
    tmp_path: Path, stoppers: list[Callable[[], None]]
) -> None:
    old = start_s3(tmp_path / "s3")
    stoppers.append(old.stop)
    old_pid = old.pid()
    assert old_pid is not None
    # "forget" the handle, as a killed parent would, and start again on another port
    port = free_port()
    new = start_s3(tmp_path / "s3", port)
    stoppers.append(new.stop)
    assert new.port == port
    assert old.process is not None and old.process.wait(5) is not None
    assert weeds_in(tmp_path / "s3") == [new.pid()]


def test_broken_credentials_file_is_refused(tmp_path: Path) -> None:
    from im_server.runtime.embedded import EmbeddedRuntimeError

    folder = tmp_path / "s3"
    folder.mkdir(mode=0o700)
    (folder / CREDENTIALS_FILE).write_text('{"access_key": "x", "secret_key": "leaky-secret"}')
    with pytest.raises(EmbeddedRuntimeError) as info:
        start_s3(folder)
    assert "leaky-secret" not in str(info.value)
    assert weeds_in(folder) == []


async def test_serve_runs_its_own_s3(tmp_path: Path) -> None:
    """``im-server serve`` with no store settings at all: S3 comes up with the others,
    answers signed requests with the keys in the data folder, and goes with the server."""
    data = tmp_path / "data"
    env = {
        "IM_DATABASE_URL": "",
        "IM_REDIS_URL": "",
        "IM_S3_ENDPOINT": "",
        "IM_TEST_LOG_DIR": str(tmp_path),
    }
    srv = ServerProcess(env=env, data_dir=data).start(timeout=120)
    try:
        creds = read_credentials(data / "s3")
        weeds = weeds_in(data / "s3")
        assert len(weeds) == 1
        port = json.loads((data / "s3" / "im-server.ports").read_text())["s3.port"]
        assert f"embedded S3 http://127.0.0.1:{port}" in srv.log_tail(200)
        settings = load_settings(
            s3_endpoint=f"http://127.0.0.1:{port}",
            s3_access_key=creds.access_key,
            s3_secret_key=creds.secret_key,
        )
        async with ObjectStore(settings) as store:
            await store.ensure_bucket()
            await store.put("hello", b"world", "text/plain")
            assert await store.get("hello", 10) == b"world"
        every_listener = {
            c.laddr.ip
            for c in psutil.Process(weeds[0]).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        assert every_listener == {"127.0.0.1"}
    finally:
        srv.terminate()
    assert weeds_in(data / "s3") == []
    assert srv.log_path is not None
    log_text = srv.log_path.read_text(errors="replace")
    assert "embedded S3 http://127.0.0.1:" in log_text
    assert creds.secret_key not in log_text


def _listening(pid: int) -> list[int]:
    """Every TCP port the process listens on (what an attacker on the host would find)."""
    conns = psutil.Process(pid).net_connections("inet")
    return sorted({c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN})


def _plain_http(port: int, method: str, path: str) -> int | None:
    """The status of an anonymous plain-HTTP request, None when the connection is cut."""
    try:
        return request_sync(method, f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except TransportError:
        return None


def _tls_without_certificate(port: int) -> str:
    """How a TLS handshake that presents no client certificate ends."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"GET /dir/status HTTP/1.1\r\nHost: x\r\n\r\n")
                return f"answered {tls.recv(64)!r}"
    except (ssl.SSLError, OSError) as e:
        return f"refused ({type(e).__name__})"


# what an anonymous caller tried on the master's port: wipe the bucket's collection,
# store a file, get a file id (and a write token), read the topology
_HOSTILE = [
    ("GET", "/col/delete?collection=im-uploads"),
    ("POST", "/submit"),
    ("GET", "/dir/assign"),
    ("GET", "/dir/status"),
    ("PUT", "/buckets/evil/x"),
    ("GET", "/buckets/?pretty=y"),
    ("DELETE", "/buckets/im-uploads/"),
]


def test_every_port_of_the_object_store_refuses_anonymous_callers(stores: Stores) -> None:
    """Every listener of the running weed process, found on the process (not from a
    list): the S3 port refuses unsigned reads, writes, deletes and listings (403); every
    other port (master, volume, filer, each gRPC port, anything else) takes mutual TLS
    only: a plain HTTP request is not served and a TLS handshake without the client
    certificate is refused. With the certificate, the master answers (the probe looks in
    the right place)."""
    pid = stores.s3.pid()
    assert pid is not None
    # the admin part starts last, after S3 is ready: wait for every part to listen
    given = set(json.loads((stores.s3.data_dir / PORTS_FILE).read_text()).values())
    deadline = time.monotonic() + 20
    while not given <= set(_listening(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    ports = _listening(pid)
    s3 = stores.s3.port
    assert given <= set(ports) and len(ports) >= 10, (ports, given)
    base = f"http://127.0.0.1:{s3}"
    for method, path in [
        ("GET", "/"),
        ("GET", "/im-uploads"),
        ("PUT", "/im-uploads/x"),
        ("DELETE", "/im-uploads/x"),
        ("DELETE", "/im-uploads"),
    ]:
        r = request_sync(method, base + path, content=b"x" if method == "PUT" else None)
        assert r.status_code == 403, (method, path, r.status_code, r.text[:200])
    for port in ports:
        if port == s3:
            continue
        for method, path in _HOSTILE:
            status = _plain_http(port, method, path)
            assert status in (None, 400), (port, method, path, status)
        assert _tls_without_certificate(port).startswith("refused"), port
    master = json.loads((stores.s3.data_dir / PORTS_FILE).read_text())["master.port"]
    conn = http.client.HTTPSConnection(
        "127.0.0.1", master, timeout=5, context=stores.s3.internal_tls()
    )
    try:
        conn.request("GET", "/dir/status")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    for name in ("security.toml", "tls-key.pem", "tls-cert.pem", "tls-ca.pem"):
        assert stat.S_IMODE((stores.s3.data_dir / name).stat().st_mode) == 0o600, name
