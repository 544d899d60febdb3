"""The stream partition count of a data set: what a new keyspace records, and what a
start that asks for another count gets (services/partitions.py)."""

from __future__ import annotations

import pytest

from im_server.services.partitions import (
    CLUSTER_DEFAULT,
    PartitionsMismatch,
    RedisTooOld,
    StartRefused,
    check,
    check_redis_version,
    first_count,
)


def test_a_new_cluster_keyspace_spreads_without_settings() -> None:
    assert first_count(None, cluster=True, has_data=False) == CLUSTER_DEFAULT
    assert CLUSTER_DEFAULT >= 16  # well above any shard count the docs describe


def test_a_single_redis_keeps_one_partition() -> None:
    assert first_count(None, cluster=False, has_data=False) == 1


def test_data_made_before_the_record_keeps_the_count_it_ran_with() -> None:
    # a stream in Redis, no record: the old default (1), or the
    # count configured, never the new default (that would re-key every conversation)
    assert first_count(None, cluster=True, has_data=True) == 1
    assert first_count(8, cluster=True, has_data=True) == 8


def test_a_configured_count_is_recorded_as_asked() -> None:
    assert first_count(8, cluster=True, has_data=False) == 8
    assert first_count(4, cluster=False, has_data=False) == 4


@pytest.mark.parametrize("configured", [None, 64])
def test_a_start_that_agrees_gets_the_recorded_count(configured: int | None) -> None:
    assert check(configured, 64) == 64


def test_a_start_with_another_count_is_refused_with_what_to_do() -> None:
    with pytest.raises(PartitionsMismatch) as e:
        check(8, 64)
    text = str(e.value)
    assert "IM_STREAM_PARTITIONS=8" in text and "64" in text and "docs/scaling.md" in text


@pytest.mark.parametrize("version", ["7.0.0", "7.2.4", "8.2.1", "9.1.2", None, "unknown", "7"])
def test_redis_7_and_later_or_an_unknown_version_start(version: str | None) -> None:
    check_redis_version(version)


@pytest.mark.parametrize("version", ["6.2.12", "6.0.16", "5.0.7", "2.8.0"])
def test_an_older_redis_is_refused_with_what_to_do(version: str) -> None:
    with pytest.raises(RedisTooOld) as e:
        check_redis_version(version)
    assert f"Redis {version}" in str(e.value) and "7.0 or later" in str(e.value)
    assert isinstance(e.value, StartRefused)  # the CLI's one-line refusal
