"""Which failures are a store's (answered `unavailable`, retried by the client) and which
are bugs: a Redis Cluster between two slot maps is a store failure, and so are sends
that could not be shown to have reached a replica."""

from __future__ import annotations

import pytest
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    MasterDownError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from im_server.errors import is_store_error
from im_server.storage.redis.store import ReplicaWaitError


@pytest.mark.parametrize(
    "exc",
    [
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        ClusterError("TTL exhausted."),
        TryAgainError("TRYAGAIN"),
        MasterDownError("MASTERDOWN"),
        ReadOnlyError("READONLY You can't write against a read only replica."),
        ReplicaWaitError("0 of 1 replicas took the sends in 500 ms"),
        ConnectionRefusedError(),
    ],
)
def test_cluster_transitions_are_store_failures(exc: BaseException) -> None:
    assert is_store_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ResponseError("ERR Error running script: attempt to compare nil with number"),
        ValueError("a bug"),
        KeyError("x"),
    ],
)
def test_script_errors_and_bugs_are_not(exc: BaseException) -> None:
    assert not is_store_error(exc)


def _chained(*chain: BaseException) -> BaseException:
    """``chain[0]`` raised from ``chain[1]`` raised from ...: as SQLAlchemy wraps asyncpg."""
    for outer, inner in zip(chain, chain[1:], strict=False):
        outer.__cause__ = inner
    return chain[0]


def test_postgres_shutting_down_while_connecting_is_a_store_failure() -> None:
    """What a pool checkout raises while PostgreSQL shuts down: a DBAPIError around the
    dialect's Error around asyncpg's CannotConnectNowError (no OSError anywhere)."""
    import asyncpg
    from sqlalchemy.exc import DBAPIError

    exc = _chained(
        DBAPIError("connect", None, Exception("the database system is shutting down")),
        Exception("the database system is shutting down"),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
    )
    assert is_store_error(exc)


def test_a_postgres_bug_down_the_chain_is_not() -> None:
    import asyncpg
    from sqlalchemy.exc import DBAPIError

    exc = _chained(
        DBAPIError("select", None, Exception("syntax")),
        Exception("syntax"),
        asyncpg.PostgresSyntaxError("syntax error at or near"),
    )
    assert not is_store_error(exc)


def test_a_cause_cycle_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_store_error(a)
