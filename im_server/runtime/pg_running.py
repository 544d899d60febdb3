"""The PostgreSQL a server already runs on a data folder, for a command run beside it
(``im-server apikey``): found by its ``postmaster.pid``, reached with the folder's
password."""

from __future__ import annotations

from pathlib import Path

from im_server.runtime.passwords import read_password
from im_server.runtime.postgres import pg_url, read_postmaster_pid
from im_server.runtime.processes import is_ours, proc


def running_url(data_dir: Path) -> str | None:
    """The URL of the PostgreSQL already running on PGDATA ``data_dir`` (a server's
    embedded store), for a command run beside it; None when none runs there."""
    pgdata = Path(data_dir).expanduser().absolute()
    pid, port = read_postmaster_pid(pgdata)
    if pid is None or port is None:
        return None
    p = proc(pid)
    if p is None or not is_ours(p, "postgres", pgdata):
        return None
    try:
        return pg_url(read_password(pgdata), port)
    except OSError:
        return None
