"""The stores' passwords: made at first start, kept in a 0600 file, reused afterwards.

Each store keeps its own password in ``im-server.password`` in its own folder. Editing
that file (any 16 to 256 of ``A-Z a-z 0-9 - . _ ~``, so it can stand in a URL as is) and
restarting changes the password; an empty or missing file gets a new random one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from pathlib import Path

from im_server.runtime.ownership import StoreUser, read_private, write_private
from im_server.runtime.processes import EmbeddedRuntimeError

PASSWORD_FILE = "im-server.password"
_VALID = re.compile(r"[A-Za-z0-9._~-]{16,256}")
_SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations


def new_password() -> str:
    return secrets.token_urlsafe(32)


def load_or_create_password(store_dir: Path, user: StoreUser) -> str:
    """The password kept in ``store_dir``; a new one is made (and kept) when there is none."""
    path = store_dir / PASSWORD_FILE
    try:
        password = read_private(path, user).strip()
    except FileNotFoundError:
        password = ""
    if not password:
        password = new_password()
        write_private(path, password + "\n", user)
        return password
    if not _VALID.fullmatch(password):
        # The message must not quote the file: it holds a password, if a malformed one.
        raise EmbeddedRuntimeError(
            f"{path} does not hold a usable password: it must be 16 to 256 characters "
            "of A-Z a-z 0-9 - . _ ~ (empty the file to get a new random one)"
        )
    return password


def read_password(store_dir: Path) -> str:
    """The password kept in a store folder (for tools and tests that connect by hand)."""
    return (Path(store_dir) / PASSWORD_FILE).read_text().strip()


def scram_sha256_verifier(password: str, salt: bytes | None = None) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5802/7677 as in its
    ``scram_build_secret``): handing this to ``ALTER ROLE ... PASSWORD`` sets the password
    without the password itself ever reaching the server, its logs or its errors."""
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def password_digest(password: str) -> str:
    """A fingerprint of a password, to tell whether it was already applied."""
    return hashlib.sha256(b"im-server store password\0" + password.encode()).hexdigest()
