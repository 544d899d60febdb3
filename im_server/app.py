"""create_app(settings): the FastAPI app. The lifespan opens the store pools, starts the
fan-out and, unless disabled, the in-process persister; shutdown runs in steps: close
sockets (1012), finish the persister's batch, close the pools."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from im_server import __version__
from im_server.api import (
    accounts,
    conversations,
    friends,
    groups,
    ops,
    presence,
    protocol,
    push,
    server_webhooks,
    sync,
)
from im_server.api import bots as bots_api
from im_server.api import search as search_api
from im_server.api import server as server_api
from im_server.api import uploads as uploads_api
from im_server.api.failures import install_error_handlers
from im_server.config import Settings, load_settings
from im_server.context import Context, TTLCache
from im_server.context.app_tokens import AppTokens, load_public_keys
from im_server.context.batching import Coalescer, KeyedCoalescer
from im_server.context.before_send import BeforeSendHook
from im_server.context.health import Health
from im_server.context.limits import RateLimits, SharedRates
from im_server.gateway import ws
from im_server.gateway.fanout import PRESENCE_S, Fanout
from im_server.gateway.hub import Hub
from im_server.gateway.longpoll import LongPolls
from im_server.gateway.presence import PresenceTracker
from im_server.gateway.recheck import TokenRecheck
from im_server.metrics import STREAM_DEPTH
from im_server.metrics_access import MetricsListener
from im_server.protocol.close_codes import CloseCode
from im_server.runtime import heap
from im_server.services import (
    deletion,
    idempotency,
    outbox,
    partitions,
    push_registrations,
    read,
    recovery,
    send_stores,
    uploads,
    webhooks,
)
from im_server.storage.db import create_engine
from im_server.storage.objects import ObjectStore
from im_server.storage.redis.store import RedisStore
from im_server.workers.cursors import CursorBatcher
from im_server.workers.periodic import Periodic, stop_all
from im_server.workers.persister import Persister
from im_server.workers.pusher import Pusher
from im_server.workers.receipts import ReceiptPusher
from im_server.workers.thumbnails import Thumbnailer
from im_server.workers.webhooks import WebhookDeliverer

log = logging.getLogger("im_server.app")
WEB_DIR = Path(__file__).parent / "web"
CLOSE_RESTART = CloseCode.RESTART
EPOCH_CHECK_S = 1.0  # a Redis that lost its data is noticed within a second
LONG_POLL_EXPIRY_S = 30.0
STREAM_DEPTH_S = 5.0
PUSH_PRUNE_S = 3600.0

TAGS = [
    {"name": "accounts", "description": "Users, sessions (bearer tokens)."},
    {"name": "friends", "description": "Friend requests and the friend list."},
    {"name": "groups", "description": "Groups and their members."},
    {"name": "conversations", "description": "States, history, sends, read state."},
    {
        "name": "sync",
        "description": "Catch-up for devices: changed states since a version, long polls.",
    },
    {"name": "operations", "description": "Health, readiness, metrics."},
    {"name": "protocol", "description": "The WebSocket frames, as a JSON Schema."},
    {"name": "push", "description": "Push registrations of my sessions (APNs, FCM)."},
]


def build_context(settings: Settings) -> Context:
    """The context of a process: stores, batchers, limits. The gateway's own parts (its
    event sink, long polls, receipts, cursor batcher) are plugged in by the lifespan."""
    redis = RedisStore(
        settings.redis_url or "",
        dedupe_ttl=settings.dedupe_ttl_seconds,
        timeout=settings.store_timeout_seconds,
        low_water=max(1, settings.seq_block_size // 2),
        partitions=settings.stream_partitions or 1,  # settled by services/partitions.settle
        cluster=settings.redis_cluster,
        wait_replicas=settings.wait_replicas,
        wait_timeout_ms=settings.redis_wait_timeout_ms,
        ack_without_replica=settings.redis_ack_without_replica,
    )
    engine = create_engine(settings)
    return Context(
        settings=settings,
        db=engine,
        redis=redis,
        send_batcher=KeyedCoalescer(
            redis.send_many, lambda a: a.partition, settings.send_batch_max
        ),
        dedupe_checker=send_stores.dedupe_checker(engine),
        health=Health(engine, redis),
        rate=RateLimits.from_settings(settings, SharedRates(redis.take_rates)),
        object_store=ObjectStore(settings) if settings.s3_endpoint else None,
        auth_cache=TTLCache(settings.auth_cache_seconds),
        api_key_cache=TTLCache(API_KEY_CACHE_S),
        app_tokens=app_tokens_of(settings),
        before_send=before_send_of(settings, redis),
        members_cache=TTLCache(settings.members_cache_seconds),
    )


IDEMPOTENCY_PRUNE_S = 600.0
WEBHOOK_DEPTH_S = 10.0  # queue depths for /metrics, and the prune of old deliveries
API_KEY_CACHE_S = 5.0  # a revoked API key stops working everywhere within this


def before_send_of(settings: Settings, redis: RedisStore) -> BeforeSendHook:
    url = settings.before_send_url.get_secret_value() if settings.before_send_url else ""
    secret = settings.before_send_secret
    return BeforeSendHook(
        url=url or None,
        secret=secret.get_secret_value() if secret else None,
        timeout_s=settings.before_send_timeout_ms / 1000,
        breaker_failures=settings.before_send_breaker_failures,
        breaker_s=settings.before_send_breaker_seconds,
        reads=Coalescer(redis.send_decisions, 500),
        keeps=Coalescer(redis.keep_send_decisions, 500),
    )


def app_tokens_of(settings: Settings) -> AppTokens:
    """The keys of app-signed tokens the settings name (a bad key file stops the start)."""
    secret = settings.jwt_hs256_secret.get_secret_value() if settings.jwt_hs256_secret else ""
    if secret and len(secret.encode()) < 32:
        # RFC 7518 3.2: an HS256 key of fewer than 256 bits can be guessed offline
        raise ValueError("IM_JWT_HS256_SECRET: at least 32 bytes")
    return AppTokens(
        hs256_secret=secret.encode() or None,
        public_keys=load_public_keys(settings.jwt_public_keys) if settings.jwt_public_keys else [],
        jwks_url=settings.jwt_jwks_url or None,
        issuer=settings.jwt_issuer or None,
        audience=settings.jwt_audience or None,
        leeway_s=settings.jwt_leeway_seconds,
        refetch_s=settings.jwt_jwks_refetch_seconds,
    )


def settle_partitions(settings: Settings) -> Settings:
    """The data set's stream partition count (``services/partitions.py``), settled once
    before any server process starts: the settings with it."""

    async def settle() -> int:
        ctx = build_context(settings)
        try:
            return await partitions.settle(ctx)
        finally:
            await ctx.redis.close()
            await ctx.db.dispose()

    count = asyncio.run(settle())
    return settings.model_copy(update={"stream_partitions": count})


def periodic_jobs(
    ctx: Context, fanout: Fanout, presence: PresenceTracker | None = None
) -> list[Periodic]:
    """A gateway's background chores, each at its own pace."""

    async def expire_long_polls() -> None:
        await ctx.redis.expire_long_polls()

    async def stream_depth() -> None:
        STREAM_DEPTH.set(await ctx.redis.stream_depth(ctx.settings.partitions))

    async def watch_epoch() -> None:
        await recovery.watch_epoch(ctx)

    async def sweep_outbox() -> None:
        await outbox.sweep(ctx)

    async def prune_push_registrations() -> None:
        await push_registrations.prune_expired(ctx)

    async def prune_uploads() -> None:
        await uploads.prune_unsent(ctx)
        await uploads.prune_raw(ctx)

    async def finish_deletions() -> None:
        await deletion.finish_pending(ctx)

    async def prune_idempotency() -> None:
        await idempotency.prune(ctx)

    async def webhook_depths() -> None:
        await webhooks.report_depths(ctx)

    jobs = [
        Periodic("node-presence", PRESENCE_S, fanout.beat),
        Periodic("notice-outbox", ctx.settings.outbox_sweep_seconds, sweep_outbox),
        Periodic("redis-epoch", EPOCH_CHECK_S, watch_epoch),
        Periodic("long-poll-expiry", LONG_POLL_EXPIRY_S, expire_long_polls),
        Periodic("stream-depth", STREAM_DEPTH_S, stream_depth),
        Periodic("push-registration-expiry", PUSH_PRUNE_S, prune_push_registrations),
        Periodic("upload-expiry", ctx.settings.upload_prune_seconds, prune_uploads),
        Periodic("account-deletion", ctx.settings.deletion_sweep_seconds, finish_deletions),
        Periodic("idempotency-expiry", IDEMPOTENCY_PRUNE_S, prune_idempotency),
        Periodic("webhook-depth", WEBHOOK_DEPTH_S, webhook_depths),
    ]
    if ctx.redis.cluster:
        jobs.append(
            Periodic("cluster-map", ctx.settings.redis_map_refresh_seconds, ctx.redis.refresh_map)
        )
    if presence is not None:
        s = ctx.settings
        jobs += [
            Periodic("presence-beat", s.presence_beat_seconds, presence.beat),
            Periodic("presence-sweep", s.presence_sweep_seconds, presence.sweep),
        ]
    return jobs


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = build_context(settings)
        await partitions.settle(ctx)
        hub = Hub()
        fanout = Fanout(ctx, hub, ctx.redis)
        ctx.events = fanout
        ctx.long_polls = LongPolls(fanout, ctx.redis)
        app.state.ctx = ctx
        tracker = PresenceTracker(ctx, hub)
        app.state.gateway = ws.Gateway(ctx, hub, fanout, tracker)
        await fanout.start()
        await tracker.start()
        if ctx.object_store is not None:
            await ctx.object_store.start()
            await uploads.ensure_bucket(ctx)
        jobs = periodic_jobs(ctx, fanout, tracker)
        for job in jobs:
            job.start()
        recheck = TokenRecheck(ctx, hub)
        recheck.start()
        receipts = ReceiptPusher(ctx)
        ctx.receipts = receipts
        batcher = CursorBatcher(
            ctx, lambda kind, res, origins: read.on_moved(ctx, kind, res, origins)
        )
        ctx.cursors = batcher
        batcher.start()
        receipts.start()
        persister = Persister(ctx) if settings.run_persister else None
        if persister:
            await persister.start()
        pusher = Pusher(ctx) if settings.push_enabled and settings.run_pusher else None
        if pusher:
            await pusher.start()
        thumbnailer = Thumbnailer(ctx) if settings.run_thumbnailer else None
        if thumbnailer:
            await thumbnailer.start()
        deliverer = WebhookDeliverer(ctx) if settings.run_webhooks else None
        if deliverer:
            deliverer.start()
        metrics_listener = MetricsListener.for_settings(settings)
        heap.settle()
        log.info("im-server %s ready (node %s)", __version__, settings.node_name)
        try:
            yield
        finally:
            if metrics_listener:
                metrics_listener.stop()
            hub_conns = hub.all()
            for c in hub_conns:
                c.close(CLOSE_RESTART, "server restarting")
            await asyncio.sleep(0.05 if hub_conns else 0)
            await recheck.stop()
            await batcher.stop()
            await receipts.stop()
            if persister:
                await persister.stop()
            if pusher:
                await pusher.stop()
            if thumbnailer:
                await thumbnailer.stop()
            if deliverer:
                await deliverer.stop()
            await stop_all(jobs)
            await tracker.stop()
            await fanout.stop()
            if ctx.background:
                await asyncio.wait(list(ctx.background), timeout=2.0)
            await ctx.redis.close()
            await ctx.before_send.close()
            if ctx.object_store is not None:
                await ctx.object_store.close()
            await ctx.db.dispose()

    app = FastAPI(
        title="im-server",
        version=__version__,
        description="WebSocket instant messaging: dense per-conversation seqs, forward-only read cursors, sync.",
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    app.state.settings = settings

    install_error_handlers(app)

    for r in (
        ops.router,
        accounts.router,
        friends.router,
        friends.blocks_router,
        groups.router,
        conversations.router,
        sync.router,
        presence.router,
        protocol.router,
        push.router,
        uploads_api.router,
        search_api.router,
        server_api.router,
        server_webhooks.router,
        bots_api.router,
    ):
        app.include_router(r)
    if WEB_DIR.is_dir() and (WEB_DIR / "index.html").exists():
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app


def app_factory() -> Any:
    """For ``uvicorn --factory im_server.app:app_factory``."""
    from im_server.transport.guard import HttpGuard

    api = create_app()
    return ws.with_websocket(HttpGuard(api, api.state.settings.max_body_bytes))
