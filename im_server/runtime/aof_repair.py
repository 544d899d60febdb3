"""A torn append-only file after a crash: which file Valkey could not load, and cutting
it at its first bad byte (``valkey-check-aof --fix``) so the store starts again with
every command before the tear."""

from __future__ import annotations

import os
import re
from pathlib import Path

from im_server.runtime.ownership import StoreUser, read_private, valkey_server_binary
from im_server.runtime.processes import run, store_env

# What Valkey logs when an AOF file does not load; the file's name follows.
_AOF_ERROR = re.compile(
    r"(?:Bad file format|Unexpected end of file) reading the append only file (\S+?)[:.]?(?:\s|$)"
)
_VALKEY_RDB_MAGIC = b"VALKEY"
AOF_FILE = "appendonly.aof"  # Redis 6.2's single AOF, and the prefix of Valkey's files
AOF_DIR = "appendonlydir"
AOF_MANIFEST = f"{AOF_FILE}.manifest"


def _last_aof_file(data_dir: Path, user: StoreUser) -> Path | None:
    """The AOF file Valkey loads last: the last increment in the manifest, else its base;
    ``appendonly.aof`` itself in a folder of Redis 6.2 that Valkey has not moved yet."""
    try:
        manifest = read_private(data_dir / AOF_DIR / AOF_MANIFEST, user)
    except FileNotFoundError:
        old = data_dir / AOF_FILE
        return old if old.exists() else None
    base: str | None = None
    incr: str | None = None
    for line in manifest.splitlines():
        # file <name> seq <n> type <b|h|i>: the base, history (not loaded), increments
        words = line.split()
        if len(words) < 2 or words[0] != "file":
            continue
        kind = dict(zip(words[2::2], words[3::2], strict=False)).get("type")
        if kind == "b":
            base = words[1]
        elif kind == "i":
            incr = words[1]
    name = incr or base
    return None if name is None else data_dir / AOF_DIR / name


def aof_to_repair(data_dir: Path, new_log: str, user: StoreUser) -> Path | None:
    """The file to cut at its first bad byte: Valkey's log says it could not load it, and
    it is the last one it loads (a crash only tears the end of the AOF). Else None."""
    named = {m.group(1) for m in _AOF_ERROR.finditer(new_log)}
    last = _last_aof_file(data_dir, user)
    if last is None or last.name not in named:
        return None
    try:
        fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if fh.read(len(_VALKEY_RDB_MAGIC)) == _VALKEY_RDB_MAGIC:
            # A snapshot Valkey wrote whole (a temp file, then a rename): no crash tears
            # it, and the check tool would take it for commands and cut it to nothing.
            return None
    return last


def fix_aof(aof: Path, user: StoreUser) -> str:
    """``valkey-check-aof --fix`` on one file; the valkey-server binary acts as the tool
    when argv[0] says so.

    It is given the file, not the manifest: given the manifest it checks the base snapshot
    too, takes one written by Valkey 9 (an RDB opening with ``VALKEY``, not ``REDIS``) for
    commands and refuses to go on. Given one file, it checks it as an AOF of its own and
    may cut its end, which is right for the last file Valkey loads."""
    return run(
        ["valkey-check-aof", "--fix", str(aof)],
        what="valkey-check-aof --fix",
        timeout=300,
        input_text="y\n",
        cwd=str(aof.parent),
        env=store_env(),
        umask=0o077,
        executable=valkey_server_binary(),
        **user.run_kwargs(),
    )
