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
