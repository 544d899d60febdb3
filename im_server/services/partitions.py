"""How many stream partitions a data set has: decided once, recorded in the keyspace it
shapes, and the same for every process after.

A conversation's Redis keys (its seq counter, dedupe keys, rights, its stream) carry the
hash tag of partition ``crc32(conv_id) % N``; in cluster mode a partition is one slot,
so N bounds how many shards the sends can spread over. Why a recorded value: with
N = 1 (the old default) cluster mode put every conversation on one primary, and a
process started with another N than its peers would put a conversation's keys under
another tag: its seqs would restart from a fresh block and its dedupe keys would be
missed. So a new keyspace in cluster mode gets ``CLUSTER_DEFAULT`` (well above any
shard count one would run), a single Redis gets 1 (nothing to spread over), and a
start that asks for another count than the recorded one is refused with what to do.

A keyspace made before the count was recorded (its first stream exists, no record) ran
with the count configured then: ``IM_STREAM_PARTITIONS``, or 1. A new keyspace next to
a database that holds data (a move from a single Redis to a cluster) takes the default:
its keys are all new anyway, and the seqs go on from the database.

Settling also checks that the Redis-compatible store is recent enough for this release
(``check_redis_version``): an older one is refused at start with what to do, rather than
failing every send."""

from __future__ import annotations

import logging

from im_server.context import Context

log = logging.getLogger("im_server.partitions")

CLUSTER_DEFAULT = 64
SINGLE_DEFAULT = 1


MIN_REDIS = (7, 0)
"""The oldest Redis this release runs on: the send script claims a dedupe key with ``SET
... NX GET`` (NX and GET together came with Redis 7.0), and on a Cluster deliveries use
sharded pub/sub (7.0 too). Valkey reports the Redis version it matches (7.2.4)."""


class StartRefused(Exception):
    """The stores cannot serve this start as they are; the message says what to do."""


class PartitionsMismatch(StartRefused):
    """A start asked for another partition count than the data set has."""


class RedisTooOld(StartRefused):
    """The Redis-compatible store is older than :data:`MIN_REDIS`."""


def check_redis_version(version: str | None) -> None:
    """Refuse a Redis older than :data:`MIN_REDIS`. An unknown version (INFO refused, a
    form not understood) is let through: the first send then says what failed."""
    if version is None:
        return
    major, _, rest = version.partition(".")
    minor = rest.partition(".")[0]
    if not (major.isdigit() and minor.isdigit()):
        return
    if (int(major), int(minor)) < MIN_REDIS:
        raise RedisTooOld(
            f"IM_REDIS_URL serves Redis {version}; im-server needs Redis "
            f"{MIN_REDIS[0]}.{MIN_REDIS[1]} or later, or Valkey (the send script claims "
            "each send's dedupe key with SET NX GET)"
        )


def first_count(configured: int | None, cluster: bool, has_data: bool) -> int:
    """The count to record for a keyspace that has none recorded."""
    if configured is not None:
        return configured
    if has_data:
        return SINGLE_DEFAULT  # what a data set made before the record ran with
    return CLUSTER_DEFAULT if cluster else SINGLE_DEFAULT


def check(configured: int | None, recorded: int) -> int:
    """The recorded count, unless the configuration asks for another one."""
    if configured is not None and configured != recorded:
        raise PartitionsMismatch(
            f"IM_STREAM_PARTITIONS={configured}, but this data set was made with "
            f"{recorded} stream partitions (recorded in Redis under 'im:partitions'); "
            f"unset IM_STREAM_PARTITIONS or set it to {recorded}. Changing the count "
            "re-keys every conversation: see docs/scaling.md, 'Growing'"
        )
    return recorded


async def settle(ctx: Context) -> int:
    """The partition count of this data set, recorded if it was not; sets it on the
    context (the composition root calls this before anything reads it)."""
    check_redis_version(await ctx.redis.server_version())
    configured = ctx.settings.stream_partitions
    recorded = await ctx.redis.recorded_partitions()
    if recorded is None:
        has_data = await ctx.redis.has_streams()
        want = first_count(configured, ctx.settings.redis_cluster, has_data)
        recorded = await ctx.redis.record_partitions(want)
    count = check(configured, recorded)
    ctx.settings = ctx.settings.model_copy(update={"stream_partitions": count})
    ctx.redis.partitions = count
    if ctx.settings.redis_cluster and await ctx.redis.full_coverage_required():
        log.warning(
            "the Redis Cluster has cluster-require-full-coverage yes: while any slot has "
            "no live primary, every node refuses every command, so one shard's failure "
            "stops the sends of all; set it to no (see docs/scaling.md, 'Cluster mode')"
        )
    return count
