"""Settings, read from the environment (prefix ``IM_``).

Built by ``load_settings()`` when the app or a command starts, never at import time, so
tests and the embedded runtime can set the store URLs before anything reads them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    receipts_full_max: int = 100
    receipts_partial_max: int = 500
    receipts_count_max: int = 3000
    receipts_partial_readers: int = 20
    receipt_push_interval_ms: int = 1000

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

    @property
    def embedded(self) -> bool:
        return not (self.database_url and self.redis_url)


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]
