"""The ``im-server`` command: serve | persister | migrate.

``serve`` with no IM_DATABASE_URL / IM_REDIS_URL starts a real PostgreSQL and Redis under
the data folder (``./.im-data``), runs the migrations, and serves; with both URLs set it
uses those servers and starts nothing. The object store is apart: with no IM_S3_ENDPOINT
it starts SeaweedFS under the same folder, with it set it uses that store."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from im_server import logs
from im_server.cli_apikeys import add_apikey_parser
from im_server.config import Settings, load_settings

if TYPE_CHECKING:
    import uvicorn

    from im_server.runtime.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedS3

log = logging.getLogger("im_server.cli")


def _start_embedded(
    settings: Settings, handles: list[object]
) -> tuple[Settings, EmbeddedPostgres, EmbeddedRedis]:
    """Start both stores; each goes into ``handles`` (to be stopped, Redis first) as soon
    as it runs, so a failure of the second does not leave the first running."""
    from im_server.runtime.embedded import prepare_data_dir, start_postgres, start_redis

    data = prepare_data_dir(settings.data_dir)
    t0 = time.monotonic()
    pg = start_postgres(data / "pg")
    handles.insert(0, pg)
    rd = start_redis(data / "redis")
    handles.insert(0, rd)
    log.info("embedded stores up in %.2f s", time.monotonic() - t0)
    os.environ["IM_DATABASE_URL"] = pg.url
    os.environ["IM_REDIS_URL"] = rd.url
    return settings.model_copy(update={"database_url": pg.url, "redis_url": rd.url}), pg, rd


def _start_embedded_s3(settings: Settings, handles: list[object]) -> tuple[Settings, EmbeddedS3]:
    """Start the embedded object store (with or without the other embedded stores) and
    point the settings at it; it is stopped first, before Redis and PostgreSQL."""
    from im_server.runtime.embedded import prepare_data_dir, start_s3

    data = prepare_data_dir(settings.data_dir)
    s3 = start_s3(data / "s3", external_url=settings.s3_public_endpoint)
    handles.insert(0, s3)
    os.environ.update(s3.env())
    update = {
        "s3_endpoint": s3.endpoint,
        "s3_access_key": s3.access_key,
        "s3_secret_key": SecretStr(s3.secret_key),
        "s3_region": s3.region,
    }
    return settings.model_copy(update=update), s3


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_all(handles: list[object]) -> None:
    for h in handles:
        try:
            h.stop()  # type: ignore[attr-defined]
        except Exception:
            log.exception("stopping %r failed", h)


def _serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    if args.no_persister:
        overrides["run_persister"] = False
    if args.workers is not None:
        overrides["workers"] = args.workers
    return overrides


def _stores_up(settings: Settings, handles: list[object]) -> tuple[Settings, str]:
    """The embedded stores when no URLs are configured, then the migrations; returns the
    settings pointing at the stores and what the start-up line says about them."""
    data_note = "using the configured PostgreSQL and Redis"
    if settings.embedded:
        settings, pg, rd = _start_embedded(settings, handles)
        data_note = (
            f"data in {settings.data_dir.resolve()} "
            f"(embedded PostgreSQL {pg.display_url}, Valkey {rd.display_url})"
        )
    if settings.embedded_s3:
        settings, s3 = _start_embedded_s3(settings, handles)
        data_note += f"; embedded S3 {s3.endpoint} in {settings.data_dir.resolve() / 's3'}"
    else:
        data_note += f"; S3 at {settings.s3_endpoint}"
    from im_server.storage.db import run_migrations

    assert settings.database_url
    run_migrations(settings.database_url)
    from im_server.app import settle_partitions

    settings = settle_partitions(settings)
    os.environ["IM_STREAM_PARTITIONS"] = str(settings.partitions)  # the workers' too
    return settings, data_note


def _log_stores(settings: Settings) -> None:
    # store URLs may hold passwords: masked before they reach the logging system
    log.info(
        "PostgreSQL %s, Redis %s, S3 %s bucket %s",
        logs.redact(settings.database_url or ""),
        logs.redact(settings.redis_url or ""),
        logs.redact(settings.s3_endpoint or ""),
        settings.s3_bucket,
    )


def _uvicorn_server(settings: Settings) -> uvicorn.Server:
    import uvicorn

    from im_server.app import create_app
    from im_server.gateway.ws import with_websocket
    from im_server.transport.guard import HttpGuard
    from im_server.transport.protocol import http_protocol
    from im_server.transport.ws_protocol import LeanWebSocketProtocol

    config = uvicorn.Config(
        with_websocket(HttpGuard(create_app(settings), settings.max_body_bytes)),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=http_protocol(settings),
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        ws=LeanWebSocketProtocol,
        ws_max_size=settings.max_frame_bytes,
        ws_per_message_deflate=settings.ws_compression,
        ws_ping_interval=20,
        ws_ping_timeout=20,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    return uvicorn.Server(config)


def _listening_line(settings: Settings, data_note: str, workers: str = "") -> None:
    where = f"http://{settings.host}:{settings.port}"
    print(
        f"im-server listening on {where} (WebSocket {where.replace('http', 'ws')}/v1/ws)"
        f"{workers}; {data_note}",
        flush=True,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(**_serve_overrides(args))
    logs.setup(settings.log_level, settings.log_format)
    from im_server.runtime.limits import raise_open_files

    log.info("open file limit %d (hard %d)", *raise_open_files())
    if args.worker_index is not None:
        return _serve_worker(settings, args.worker_index)
    if settings.workers > 1:
        return _serve_workers(settings)
    handles: list[object] = []
    t0 = time.monotonic()
    # SIGTERM stops everything cleanly: during start-up it interrupts; while serving,
    # uvicorn catches it, shuts down, restores this handler and re-raises the signal,
    # which lands here as KeyboardInterrupt, so the embedded stores are stopped below.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        settings, data_note = _stores_up(settings, handles)
        server = _uvicorn_server(settings)
        _listening_line(settings, data_note)
        log.info("start-up took %.2f s before serving", time.monotonic() - t0)
        _log_stores(settings)
        server.run()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _stop_all(handles)


def _serve_workers(settings: Settings) -> int:
    """The parent of ``--workers N``: stores and migrations once, then the workers
    (see ``runtime/serve_workers.py``), then the stores are stopped."""
    from im_server.runtime.serve_workers import Supervisor, check_port_free, metrics_listen_of

    n = settings.workers
    if not hasattr(socket, "SO_REUSEPORT"):
        print("--workers > 1 needs SO_REUSEPORT (Linux); use --workers 1", file=sys.stderr)
        return 2
    if settings.port == 0:
        print("--workers > 1 needs a fixed --port", file=sys.stderr)
        return 2
    try:
        check_port_free(settings.host, settings.port)
    except OSError as e:
        print(f"cannot listen on {settings.host}:{settings.port}: {e}", file=sys.stderr)
        return 1
    handles: list[object] = []
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        settings, data_note = _stores_up(settings, handles)
        _log_stores(settings)
        base = dict(os.environ)  # the embedded stores' URLs are in it by now

        def command(i: int) -> list[str]:
            cmd = [sys.executable, "-m", "im_server", "serve", "--worker-index", str(i)]
            return cmd + ["--host", settings.host, "--port", str(settings.port)]

        def env(i: int) -> dict[str, str]:
            e = {
                **base,
                "IM_NODE_NAME": f"{settings.node_name}-{i}",
                "IM_WORKERS": "1",
                # one persister per machine, as a single process runs it
                "IM_RUN_PERSISTER": "true" if settings.run_persister and i == 0 else "false",
            }
            if listen := metrics_listen_of(settings.metrics_listen, i):
                e["IM_METRICS_LISTEN"] = listen
            return e

        supervisor = Supervisor(n, command, env)
        _listening_line(settings, data_note, f" with {n} worker processes")
        log.info("start-up took %.2f s before starting the workers", time.monotonic() - t0)
        return supervisor.run()
    except KeyboardInterrupt:
        return 0
    finally:
        _stop_all(handles)


def _serve_worker(settings: Settings, index: int) -> int:
    """Worker ``index`` of ``--workers N``: the stores are up and migrated (the parent
    did it); serve on a SO_REUSEPORT socket of its own."""
    from im_server.runtime.serve_workers import listening_socket

    if settings.embedded:
        print("a serve worker needs IM_DATABASE_URL and IM_REDIS_URL", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sock = listening_socket(settings.host, settings.port)
        server = _uvicorn_server(settings)
        log.info("worker %d serving (node %s)", index, settings.node_name)
        server.run(sockets=[sock])
        return 0
    except KeyboardInterrupt:
        return 0


def cmd_persister(args: argparse.Namespace) -> int:
    settings = load_settings(run_persister=True)
    logs.setup(settings.log_level, settings.log_format)
    if settings.embedded:
        print("im-server persister needs IM_DATABASE_URL and IM_REDIS_URL", file=sys.stderr)
        return 2
    from im_server.app import build_context
    from im_server.runtime import heap
    from im_server.services import partitions
    from im_server.workers.persister import Persister

    async def main() -> None:
        ctx = build_context(settings)
        await partitions.settle(ctx)
        p = Persister(ctx)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await p.start()
        heap.settle()
        print(f"im-server persister running as consumer {p.consumer}", flush=True)
        await stop.wait()
        await p.stop()
        await ctx.redis.close()
        await ctx.db.dispose()

    import uvloop  # as serve's loop

    uvloop.run(main())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = load_settings()
    logs.setup(settings.log_level, settings.log_format)
    if not settings.database_url:
        print("im-server migrate needs IM_DATABASE_URL", file=sys.stderr)
        return 2
    from im_server.storage.db import run_migrations

    run_migrations(settings.database_url)
    print("migrations applied")
    return 0


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="im-server", description="WebSocket instant-messaging server"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser(
        "serve",
        help="run the server (embedded PostgreSQL, Redis and S3 unless IM_*_URL and "
        "IM_S3_ENDPOINT are set)",
    )
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument(
        "--data-dir",
        default=None,
        help="where embedded stores keep their data (default ./.im-data)",
    )
    s.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="server processes sharing the port (SO_REUSEPORT); default IM_WORKERS or the "
        "number of usable cores; 1 serves in this process",
    )
    s.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    s.add_argument(
        "--no-persister",
        action="store_true",
        help="run the persister elsewhere (im-server persister)",
    )
    s.set_defaults(fn=cmd_serve)
    p = sub.add_parser(
        "persister", help="run only the persister (needs IM_DATABASE_URL and IM_REDIS_URL)"
    )
    p.set_defaults(fn=cmd_persister)
    m = sub.add_parser("migrate", help="apply database migrations (needs IM_DATABASE_URL)")
    m.set_defaults(fn=cmd_migrate)
    add_apikey_parser(sub)
    b = sub.add_parser(
        "bench",
        help="load benchmark (see docs/performance.md); --help for its options",
        add_help=False,
    )
    b.set_defaults(fn=None)
    c = sub.add_parser(
        "chat", help="a terminal chat client; --help for its options", add_help=False
    )
    c.set_defaults(fn=None)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from im_server.bench.main import main as bench_main

        sys.exit(bench_main(argv[1:]))
    if argv[:1] == ["chat"]:
        from im_server.client.chat_main import main as chat_main

        sys.exit(chat_main(argv[1:]))
    args = parser.parse_args(argv)
    from im_server.runtime.processes import EmbeddedRuntimeError
    from im_server.services.partitions import StartRefused

    try:
        sys.exit(args.fn(args))
    except StartRefused as e:
        print(f"im-server: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except EmbeddedRuntimeError as e:
        # an embedded store that would not start: one line saying why (its log's tail,
        # which the message carries, goes to the log at DEBUG), no traceback
        log.debug("embedded store failure: %s", e)
        print(f"im-server: {e.summary()}", file=sys.stderr, flush=True)
        sys.exit(1)
