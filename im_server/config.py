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


def plain_pg_url(url: str) -> str:
    return "postgresql://" + asyncpg_url(url)[len("postgresql+asyncpg://") :]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IM_", extra="ignore")

    database_url: str | None = None
    redis_url: str | None = None
    data_dir: Path = Path(".im-data")
    host: str = "127.0.0.1"
    port: int = 8000

    node_name: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"

    # limits of the contract
    max_content_bytes: int = 16 * 1024
    max_frame_bytes: int = 64 * 1024
    history_limit_default: int = 50
    history_limit_max: int = 500
    max_connections_per_user: int = 20

    # send pipeline
    seq_block_size: int = 1000
    dedupe_ttl_seconds: int = 7 * 24 * 3600
    dedupe_recheck_seconds: int = 600
    stream_partitions: int = 1
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
    # failed logins: at most this many per username / per client address in the window,
    # then 429 rate_limited until the window passes
    login_fail_user_max: int = 10
    login_fail_addr_max: int = 50
    login_fail_window_seconds: int = 900

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

    # caches
    auth_cache_seconds: float = 30.0
    members_cache_seconds: float = 60.0

    # store connection pools
    db_pool_size: int = 10
    db_pool_overflow: int = 10
    store_timeout_seconds: float = 3.0

    @field_validator("stream_partitions", "seq_block_size", "persister_batch")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    @field_validator("presence_beat_seconds", "presence_node_ttl_seconds", "presence_sweep_seconds")
    @classmethod
    def _positive_seconds(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("must be > 0")
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
    def embedded(self) -> bool:
        return not (self.database_url and self.redis_url)


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]
