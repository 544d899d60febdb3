"""The Redis key layout. Keys that one script touches together carry the conversation's
``{conv_id}`` hash tag, so the layout maps onto Redis Cluster slots."""

from __future__ import annotations

import zlib

BOOT = "im:boot"  # present while this Redis holds our data; gone after a flush or a new Redis
COLD_UNTIL = "im:coldu"  # ms timestamp: until then, dedupe misses are checked in PostgreSQL
NODES = "im:nodes"  # zset node -> expiry (ms), the live gateway processes
CONTROL = "im:ctl"  # pub/sub: cache invalidations, node joins
GROUP = "persist"
LONG_POLLS = "im:lp"  # zset user_id -> expiry (ms): users with a long poll waiting somewhere  # the persister's consumer group


def seq(conv_id: str) -> str:
    return f"im:seq:{{{conv_id}}}"


def perm(conv_id: str) -> str:
    return f"im:perm:{{{conv_id}}}"


def perm_epoch(conv_id: str) -> str:
    return f"im:pe:{{{conv_id}}}"


def seq_lock(conv_id: str) -> str:
    return f"im:seqlk:{{{conv_id}}}"


def dedupe(sender_id: int, client_msg_id: str) -> str:
    return f"im:dd:{sender_id}:{client_msg_id}"


def stream(partition: int) -> str:
    return f"im:stream:{{p{partition}}}"


def partition_of(conv_id: str, partitions: int) -> int:
    return zlib.crc32(conv_id.encode()) % partitions if partitions > 1 else 0


def user_channel(user_id: int) -> str:
    return f"im:u:{user_id}"


def persister_lease(partition: int) -> str:
    return f"im:plk:{{p{partition}}}"


def login_fails_user(digest: str) -> str:
    """Failed logins of one username (``digest``: a hash of its key, so no username is
    spelled out in Redis and every key has the same short length)."""
    return f"im:lf:u:{digest}"


def login_fails_addr(addr: str) -> str:
    """Failed logins from one client address (an IPv6 client: its /64)."""
    return f"im:lf:a:{addr}"
