"""Making a PostgreSQL cluster that accepts nobody without the password: ``initdb`` into
a temp folder, the superuser's password set from its SCRAM verifier in single-user mode
(the password itself never reaches PostgreSQL or its logs), our ``pg_hba.conf``, then a
rename; and, at every start, the same password step when the password file changed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from im_server.runtime.ownership import (
    StoreUser,
    open_prefix,
    pg_install,
    read_private,
    write_private,
)
from im_server.runtime.passwords import (
    load_or_create_password,
    password_digest,
    scram_sha256_verifier,
)
from im_server.runtime.processes import HOST, EmbeddedRuntimeError, run, scrub, store_env

PG_SUPERUSER = "postgres"
AUTH_MARKER = "im-server.password-applied"
_AUTH_VERSION = "scram-v1"  # bump to make every cluster redo the password step
PG_HBA = f"""\
# Written by im-server at every start; edits here are overwritten.
# Every connection needs the {PG_SUPERUSER} password (SCRAM), over the unix socket and
# over TCP from 127.0.0.1 (the only address the server listens on).
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   {HOST}/32  scram-sha-256
"""


def pg_bin(name: str) -> str:
    return str(pg_install() / "bin" / name)


def _set_superuser_password(pgdata: Path, user: StoreUser, password: str, *, sync: bool) -> None:
    """``ALTER ROLE postgres PASSWORD '<SCRAM verifier>'`` in single-user mode (the server
    must be stopped). ``exit_on_error`` turns an error into a non-zero exit status."""
    verifier = scram_sha256_verifier(password)
    out = run(
        [
            pg_bin("postgres"),
            "--single",
            "-D",
            str(pgdata),
            "-c",
            "exit_on_error=on",
            "-c",
            f"fsync={'on' if sync else 'off'}",
            "postgres",
        ],
        what="setting the PostgreSQL password (postgres --single)",
        timeout=600,  # crash recovery of a big WAL may come first
        input_text=f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{verifier}'\n",
        hide=(password, verifier),
        cwd=str(pgdata),
        env=store_env(),
        **user.run_kwargs(),
    )
    if "ERROR:" in out or "FATAL:" in out:
        raise EmbeddedRuntimeError(
            "setting the PostgreSQL password (postgres --single) failed:\n"
            + scrub(out, (password, verifier))[-4000:]
        )


def ensure_auth(
    pgdata: Path, user: StoreUser, password: str, *, sync: bool, notes: list[str]
) -> None:
    """With the server stopped: the superuser has ``password`` and pg_hba.conf is ours.

    Crash-safe and idempotent: the marker is written only after the password took, and
    pg_hba.conf is rewritten at every start, so an interrupted run is simply redone.
    """
    marker = pgdata / AUTH_MARKER
    want = f"{_AUTH_VERSION} {password_digest(password)}\n"
    try:
        have = read_private(marker, user)
    except FileNotFoundError:
        have = ""
    if have != want:
        _set_superuser_password(pgdata, user, password, sync=sync)
        write_private(marker, want, user)
        notes.append("superuser password set" if not have else "superuser password changed")
    hba = pgdata / "pg_hba.conf"
    try:
        current = read_private(hba, user)
    except FileNotFoundError:
        current = ""
    if current != PG_HBA:
        write_private(hba, PG_HBA, user)


def initdb(pgdata: Path, user: StoreUser, *, sync: bool) -> None:
    """initdb into a sibling temp dir, give it its password and pg_hba.conf, then rename:
    PGDATA never holds a half-made cluster, nor one that would accept anyone."""
    parent = pgdata.parent
    tmp = parent / f".{pgdata.name}.initdb-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(mode=0o700)
    if user.uid is not None and user.gid is not None:
        os.chown(tmp, user.uid, user.gid)
        open_prefix(tmp, user.uid)
    args = [
        pg_bin("initdb"),
        "-D",
        str(tmp),
        "-U",
        PG_SUPERUSER,
        "--auth=reject",  # replaced by our pg_hba.conf before the first start
        "--encoding=UTF8",
        "--no-locale",
    ]
    if not sync:
        args.append("--no-sync")
    try:
        run(args, what="initdb", timeout=120, cwd=str(tmp), env=store_env(), **user.run_kwargs())
        password = load_or_create_password(tmp, user)
        ensure_auth(tmp, user, password, sync=sync, notes=[])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if pgdata.exists():
        pgdata.rmdir()  # only ever an empty dir here (see caller)
    tmp.rename(pgdata)
