"""Settings, read from the environment (prefix ``IM_``).

Built by ``load_settings()`` when the app or a command starts, never at import time, so
tests and the embedded runtime can set the store URLs before anything reads them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_PG_SCHEMES = ("postgresql+asyncpg://", "postgresql://", "postgres://")


def asyncpg_url(url: str) -> str:
    """``postgresql://``, ``postgres://`` and ``postgresql+asyncpg://`` all name the same
    database; SQLAlchemy needs the driver spelled out. Any other scheme is left as it is
    (and refused by SQLAlchemy with its own message)."""
    for scheme in _PG_SCHEMES:
        if url.startswith(scheme):
            return "postgresql+asyncpg://" + url[len(scheme) :]
    return url


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, so a container's or taskset's
    limit counts), where the platform tells; else every core of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def plain_pg_url(url: str) -> str:
    return "postgresql://" + asyncpg_url(url)[len("postgresql+asyncpg://") :]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IM_", extra="ignore")

    database_url: str | None = None
    redis_url: str | None = None
    # IM_REDIS_URL names one node of a Redis (7+) or Valkey Cluster: the client learns the rest
    redis_cluster: bool = False
    # acks wait until this many replicas have the send script's writes (WAIT after the
    # script, on its connection); unset: 1 in cluster mode, 0 on a single Redis
    redis_wait_replicas: int | None = Field(default=None, ge=0, le=16)
    redis_wait_timeout_ms: int = Field(default=500, ge=1, le=60_000)
    # a primary with fewer replicas than that (its replica was promoted, the lost node has
    # not come back): "aof" acks once the primary's own AOF has the sends (WAITAOF: an
    # acked send survives its crash), "refuse" answers `unavailable` until a replica is back
    redis_ack_without_replica: Literal["aof", "refuse"] = "aof"
    # cluster mode: how often every process learns the slot map again (a primary that was
    # added and given a slot is used from then on; moves and fail-overs are also learnt
    # from the first MOVED or failed call)
    redis_map_refresh_seconds: float = Field(default=10.0, gt=0, le=3600)
    data_dir: Path = Path(".im-data")
    host: str = "127.0.0.1"
    port: int = 8000
    # `serve` processes sharing host:port (SO_REUSEPORT); 1 serves in the process itself
    workers: int = Field(default_factory=usable_cores, ge=1, le=256)

    node_name: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"

    # limits of the contract
    max_content_bytes: int = 16 * 1024
    max_frame_bytes: int = 64 * 1024
    history_limit_default: int = 50
    history_limit_max: int = 500
    max_connections_per_user: int = 20
    # permessage-deflate on WebSockets (when a client asks, as browsers do): off, because
    # its compressor and decompressor cost a socket ~33 KiB, three times all else it
    # holds, for frames that are mostly a few hundred bytes
    ws_compression: bool = False

    # send pipeline
    seq_block_size: int = 1000
    dedupe_ttl_seconds: int = 7 * 24 * 3600
    dedupe_recheck_seconds: int = 600
    # unset: the count recorded with the data set, or for a new one 64 in cluster mode
    # and 1 on a single Redis (services/partitions.py); set: must match the recorded one
    stream_partitions: int | None = Field(default=None, ge=1, le=1024)
    send_batch_max: int = 256

    # persister
    run_persister: bool = True
    persister_batch: int = 1000
    persister_block_ms: int = 1000
    # a partition's persister lease; a crashed persister's partition (and its pending
    # entries) is taken over this long after its last renewal
    persister_claim_idle_ms: int = 5_000

    # passwords (argon2id); tests lower the cost
    argon2_time_cost: int = 2
    argon2_memory_kib: int = 19 * 1024
    argon2_parallelism: int = 1

    # per-user rate limits (per process); a rate <= 0 turns a limit off
    rate_send_per_s: float = 100.0
    rate_send_burst: float = 500.0
    rate_read_per_s: float = 100.0
    rate_read_burst: float = 500.0
    rate_typing_per_s: float = 5.0
    rate_typing_burst: float = 10.0

    # groups and receipts
    recall_window_seconds: int = 120
    # edits and reactions
    edit_window_seconds: int = 48 * 3600
    reaction_max_emojis: int = 20  # distinct emojis on one message
    reaction_max_per_user: int = 10  # one user's reactions on one message
    receipts_full_max: int = 100
    receipts_partial_max: int = 500
    receipts_count_max: int = 3000
    receipts_partial_readers: int = 20
    receipt_push_interval_ms: int = 1000

    # sessions and logins
    # a token unused for this long stops working (401); 0 turns idle expiry off
    session_idle_days: float = 30.0
    # last_used_at is written at most this often per session (a write per request would
    # cost more than the precision is worth)
    session_touch_seconds: int = 3600
    # every open WebSocket's token is re-checked this often, so a revocation whose
    # cross-process notice was lost still closes the socket
    token_recheck_seconds: float = 60.0
    # the app's servers (docs/server-api.md): tokens the app signs itself are accepted
    # wherever a token is, with any of these keys configured: an HS256 secret, a file of
    # PEM public keys (RSA, EC, Ed25519), a JWKS URL (keys chosen by kid)
    jwt_hs256_secret: SecretStr | None = None
    jwt_public_keys: Path | None = None
    jwt_jwks_url: str | None = None
    # when set, a token's iss / aud must equal them
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # seconds of clock difference allowed on exp / nbf / iat
    jwt_leeway_seconds: float = 0.0
    # a kid the JWKS does not hold fetches it again, at most this often
    jwt_jwks_refetch_seconds: float = 60.0
    # how long a write under an Idempotency-Key is remembered
    idempotency_hours: float = 24.0
    # the longest a minted token may be asked to last (ttl_s)
    minted_token_max_days: float = 365.0
    # webhooks (docs/webhooks.md): a URL on a loopback, private or link-local address is
    # refused unless this is set (a receiver on the same host or network, tests)
    webhook_allow_private: bool = False
    webhook_timeout_seconds: float = 10.0
    # a failing delivery is retried with back-off (this, doubling, at most an hour) for
    # IM_WEBHOOK_RETRY_HOURS, then listed as failed
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_hours: float = 24.0
    # deliveries in flight per webhook and process: a slow receiver holds no more
    webhook_concurrency: int = 8
    webhook_poll_seconds: float = 0.5
    run_webhooks: bool = True
    # the before-send hook (docs/webhooks.md): every user message is POSTed there before
    # it gets a seq; its answer allows, rejects or replaces it
    before_send_url: SecretStr | None = None
    before_send_secret: SecretStr | None = None
    before_send_timeout_ms: int = 1000
    before_send_failure: Literal["allow", "reject"] = "allow"
    # a decision is kept this long per (sender, client_msg_id): a retry gets it again
    before_send_remember_seconds: int = 86400
    # this many failures in a row open the circuit for IM_BEFORE_SEND_BREAKER_SECONDS:
    # sends then take the failure policy at once, and one call per window tries again
    before_send_breaker_failures: int = 5
    before_send_breaker_seconds: float = 10.0
    # push registrations (one per session) a user may hold; one more is 409 conflict
    push_registrations_max: int = 20
    # the pusher (docs/push.md): with a gateway URL (the Matrix push-gateway API, e.g.
    # Sygnal; a URL without a path gets /_matrix/push/v1/notify), new messages and badge
    # changes are pushed to registered devices with no open connection
    push_gateway_url: SecretStr | None = None
    run_pusher: bool = True
    # False: pushes carry no content and no sender name (the phone shows a generic text)
    push_include_content: bool = True
    # Web Push (browsers with no tab open): the gateway's app id for them and its VAPID
    # public key (base64url, the "Application Server Key"); GET /v1/push/config hands
    # both to the web client. The private key stays with the gateway.
    webpush_app_id: str | None = None
    webpush_vapid_public_key: str | None = None
    # messages (and badge rows) claimed per round, and gateway calls in flight at once
    push_batch: int = 200
    push_concurrency: int = 16
    push_timeout_seconds: float = 10.0
    # a failing gateway is retried after 0.5 s, doubling up to this
    push_backoff_max_seconds: float = 30.0
    # how often a pusher looks for work another process stored (its own persister wakes
    # it at once), and how long a claimed row stays its own before another may take it
    push_poll_seconds: float = 0.5
    push_lease_seconds: float = 60.0
    # rounds start at most this often: each costs a few statements whatever it carries,
    # so under load a round takes what came in meanwhile instead of a batch at a time
    push_round_interval_seconds: float = 0.1
    # a burst of reads gives one badge-only push, this long after the first read
    push_badge_coalesce_seconds: float = 1.0
    # uploads (docs/attachments.md): the largest upload, how long its presigned PUT and a
    # download URL stay valid, and when an upload no message carries is deleted
    upload_max_bytes: int = 100 * 1024 * 1024
    upload_url_seconds: int = 900
    download_url_seconds: int = 300
    upload_unsent_hours: float = 24.0
    upload_prune_seconds: float = 600.0
    # pictures: more pixels than this are refused (a decompression bomb); thumbnails are
    # made of pictures up to `thumbnail_source_max_bytes`, by a worker in each process
    image_max_pixels: int = 40_000_000
    thumbnail_source_max_bytes: int = 32 * 1024 * 1024
    run_thumbnailer: bool = True
    thumbnail_poll_seconds: float = 1.0
    thumbnail_lease_seconds: float = 60.0
    # failed logins: at most this many per username / per client address in the window,
    # then 429 rate_limited until the window passes
    login_fail_user_max: int = 10
    login_fail_addr_max: int = 50
    login_fail_window_seconds: int = 900
    # username lookups (GET /v1/users/lookup), counted per caller and per client address
    # in Redis, so that the user base cannot be enumerated: past a limit, 429
    # rate_limited until the window (from the first lookup) passes; <= 0 turns one off
    lookup_user_max: int = 60
    lookup_addr_max: int = 300
    lookup_window_seconds: int = 900
    # account creations per client address, and friend requests per user, counted the
    # same way (across processes); <= 0 turns one off
    register_addr_max: int = 30
    register_window_seconds: int = 3600
    friend_request_user_max: int = 50
    friend_request_window_seconds: int = 3600

    # HTTP transport limits
    max_body_bytes: int = 1024 * 1024
    # a connection must send complete request headers this soon after it opens (or after
    # its previous response), and the whole request (body included) within the second
    request_header_timeout_seconds: float = 5.0
    request_body_timeout_seconds: float = 30.0
    # proxies whose X-Forwarded-For is believed (the client address of throttling)
    forwarded_allow_ips: str = "127.0.0.1"

    # /metrics: with a token, only `Authorization: Bearer <token>` may read it; with
    # metrics_listen ("127.0.0.1:9100") it is served there instead of the main port
    metrics_token: SecretStr | None = None
    metrics_listen: str | None = None

    # member changes of groups, per user (per process)
    rate_members_per_s: float = 2.0
    rate_members_burst: float = 10.0
    # searches per user (each costs a few to some tens of ms of PostgreSQL)
    rate_search_per_s: float = 10.0
    rate_search_burst: float = 50.0
    # server API requests per API key, across processes: a backend caught in a loop
    # cannot take the server from everyone else
    rate_server_api_per_s: float = 500.0
    rate_server_api_burst: float = 2000.0

    # presence: each process lists itself every `presence_beat_seconds`; its users count
    # as online until `presence_node_ttl_seconds` after its last beat (a process that died
    # is taken over by the others' sweep, every `presence_sweep_seconds`). An offline is
    # announced to friends only once the user stayed offline `presence_offline_grace_seconds`
    # (a quicker reconnect announces nothing). last_seen is kept `presence_last_seen_days`.
    presence_beat_seconds: float = 2.0
    presence_node_ttl_seconds: float = 20.0
    presence_sweep_seconds: float = 1.0
    presence_offline_grace_seconds: float = 5.0
    presence_last_seen_days: float = 90.0

    # notices written with their change (reactions, membership) and sent after the
    # commit; a notice still unsent `outbox_sweep_seconds` later (its process died, a
    # store failed) is sent by the sweep of any process, which runs that often
    outbox_sweep_seconds: float = 5.0
    # a deleted account whose clean-up (leaving its groups, ...) did not finish (its
    # process died half-way) is finished by any process, which looks that often
    deletion_sweep_seconds: float = 10.0

    # caches
    auth_cache_seconds: float = 30.0
    members_cache_seconds: float = 60.0

    # the object store of attachments (S3 API). With no endpoint, `im-server serve` runs
    # an embedded SeaweedFS under the data folder and fills endpoint and keys in itself;
    # the public endpoint is what clients use when it differs (presigned URLs carry it)
    s3_endpoint: str | None = None
    s3_public_endpoint: str | None = None
    s3_bucket: str = "im-uploads"
    s3_access_key: str | None = None
    s3_secret_key: SecretStr | None = None
    s3_region: str = "us-east-1"

    # store connection pools
    db_pool_size: int = 10
    # member adds and group creations naming more than BULK_ROWS users run at most this
    # many at once per process (see Context.bulk_writes)
    bulk_write_concurrency: int = 1
    # long polls (GET /v1/sync?wait=) of one user waiting at once in one process; more
    # are answered 429 rate_limited at once (a client needs one; a few tabs, a few)
    sync_long_polls_per_user: int = 8
    db_pool_overflow: int = 10
    store_timeout_seconds: float = 3.0

    @field_validator("seq_block_size", "persister_batch", "push_batch", "push_concurrency")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    @field_validator(
        "presence_beat_seconds",
        "presence_node_ttl_seconds",
        "presence_sweep_seconds",
        "outbox_sweep_seconds",
        "deletion_sweep_seconds",
        "push_timeout_seconds",
        "push_backoff_max_seconds",
        "push_poll_seconds",
        "push_lease_seconds",
    )
    @classmethod
    def _positive_seconds(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("must be > 0")
        return v

    @field_validator("webpush_vapid_public_key")
    @classmethod
    def _vapid_key(cls, v: str | None) -> str | None:
        """An uncompressed P-256 point, base64url: what pushManager.subscribe takes."""
        if not v:
            return None
        import base64

        try:
            raw = base64.urlsafe_b64decode(v + "=" * (-len(v) % 4))
        except ValueError:
            raw = b""
        if len(raw) != 65 or raw[0] != 4:
            raise ValueError("IM_WEBPUSH_VAPID_PUBLIC_KEY: a base64url P-256 public key (65 bytes)")
        return v

    @field_validator("database_url")
    @classmethod
    def _asyncpg_url(cls, v: str | None) -> str | None:
        return asyncpg_url(v) if v else v

    @property
    def database_dsn(self) -> str | None:
        """The database URL as libpq and asyncpg spell it (``postgresql://``)."""
        return plain_pg_url(self.database_url) if self.database_url else None

    @property
    def partitions(self) -> int:
        """The stream partition count, once settled (``services/partitions.settle``)."""
        if self.stream_partitions is None:
            raise RuntimeError("the stream partition count is not settled yet")
        return self.stream_partitions

    @property
    def wait_replicas(self) -> int:
        """Replicas a send's writes must reach before its ack (see ``redis_wait_replicas``)."""
        if self.redis_wait_replicas is not None:
            return self.redis_wait_replicas
        return 1 if self.redis_cluster else 0

    @property
    def push_enabled(self) -> bool:
        """A gateway is configured: the persister writes push rows, pushers send them."""
        return self.push_gateway_url is not None and bool(self.push_gateway_url.get_secret_value())

    @property
    def embedded(self) -> bool:
        """No PostgreSQL/Redis URLs: ``serve`` starts its own (the object store is apart:
        ``embedded_s3``)."""
        return not (self.database_url and self.redis_url)

    @property
    def embedded_s3(self) -> bool:
        """No object store endpoint: ``serve`` starts its own."""
        return not self.s3_endpoint


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]
