"""The files that configure the embedded object store (``weed mini``), made by the server
in the store's folder: the S3 keys (``im-server.credentials``) and the one identity that
holds them (``s3.json``), the listeners' ports of the previous run (``im-server.ports``),
and ``security.toml``: JWT keys of the volume and filer HTTP listeners, and mutual TLS on
every listener but S3's (``tls_certs.py``). All 0600, the store's user only."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from im_server.runtime.ownership import StoreUser, read_private, write_private
from im_server.runtime.processes import EmbeddedRuntimeError, check_port, free_port
from im_server.runtime.tls_certs import TlsFiles

CREDENTIALS_FILE = "im-server.credentials"
PORTS_FILE = "im-server.ports"
IDENTITIES_FILE = "s3.json"
SECURITY_FILE = "security.toml"
REGION = "us-east-1"
IDENTITY = "im-server"
# every listener weed mini opens, S3 first; each gets a port of its own
_LISTENERS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
SOCKET_PATH_BUDGET = 100  # sun_path holds 107 bytes + NUL


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str = field(repr=False)


def _new_credentials() -> S3Credentials:
    return S3Credentials("IM" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))


def load_or_create_credentials(s3_dir: Path, user: StoreUser) -> S3Credentials:
    """The keys kept in ``s3_dir``; new ones are made (and kept) when there are none."""
    path = s3_dir / CREDENTIALS_FILE
    try:
        text = read_private(path, user).strip()
    except FileNotFoundError:
        text = ""
    if not text:
        creds = _new_credentials()
        body = {"access_key": creds.access_key, "secret_key": creds.secret_key}
        write_private(path, json.dumps(body) + "\n", user)
        return creds
    found: S3Credentials | None
    try:
        raw = json.loads(text)
        found = S3Credentials(str(raw["access_key"]), str(raw["secret_key"]))
    except (ValueError, KeyError, TypeError):
        found = None
    if found is None or len(found.access_key) < 8 or len(found.secret_key) < 16:
        # The message must not quote the file: it holds a secret, if a malformed one.
        raise EmbeddedRuntimeError(
            f"{path} does not hold usable keys: it must be a JSON object with "
            '"access_key" (8+ characters) and "secret_key" (16+ characters); delete it '
            "to get new random ones"
        )
    return found


def read_credentials(s3_dir: Path) -> S3Credentials:
    """The keys kept in an S3 folder (for tools and tests that connect by hand)."""
    raw = json.loads((Path(s3_dir) / CREDENTIALS_FILE).read_text())
    return S3Credentials(raw["access_key"], raw["secret_key"])


def identities_config(creds: S3Credentials) -> str:
    """SeaweedFS' ``-s3.config``: one identity allowed everything, nobody anonymous."""
    return (
        json.dumps(
            {
                "identities": [
                    {
                        "name": IDENTITY,
                        "credentials": [
                            {"accessKey": creds.access_key, "secretKey": creds.secret_key}
                        ],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            },
            indent=2,
        )
        + "\n"
    )


_JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
# every internal listener, and weed's own calls between its parts, in mutual TLS
_GRPC_PARTS = ("master", "volume", "filer", "s3", "admin", "client")
_HTTPS_PARTS = ("master", "volume", "filer", "admin")


def _jwt_keys(s3_dir: Path, user: StoreUser) -> list[str]:
    """The JWT keys of an earlier start (kept: volumes hold files signed for them), or
    new ones."""
    with contextlib.suppress(FileNotFoundError):
        text = read_private(s3_dir / SECURITY_FILE, user)
        found = re.findall(r'^key = "([^"]+)"', text, re.MULTILINE)
        if len(found) == len(_JWT_SECTIONS):
            return found
    return [secrets.token_urlsafe(32) for _ in _JWT_SECTIONS]


def security_config(s3_dir: Path, user: StoreUser, tls: TlsFiles) -> str:
    """weed's ``security.toml``: JWT keys for the volume and filer HTTP listeners, and
    mutual TLS on every listener but S3's (the certificates of ``tls_certs.py``)."""
    out = [
        "# Written by im-server at every start: every internal listener of weed takes only\n"
        "# mutual TLS with the certificates of this folder; JWT keys kept from the first.\n"
    ]
    for section, key in zip(_JWT_SECTIONS, _jwt_keys(s3_dir, user), strict=True):
        out.append(f'[{section}]\nkey = "{key}"\n')
    pem = f'cert = "{tls.cert}"\nkey = "{tls.key}"\n'
    out.append(f'[grpc]\nca = "{tls.ca}"\n')
    out += [f"[grpc.{part}]\n{pem}" for part in _GRPC_PARTS]
    out.append(f'[https.client]\nenabled = true\n{pem}ca = "{tls.ca}"\n')
    out += [f'[https.{part}]\n{pem}ca = "{tls.ca}"\n' for part in _HTTPS_PARTS]
    return "\n".join(out)


def choose_ports(
    s3_dir: Path, user: StoreUser, s3_port: int | None, *, fresh: bool = False
) -> dict[str, int]:
    """The previous run's ports when they are still free (the master keeps its state in a
    folder named after its port), else (or with ``fresh``) new ones; ``s3_port`` wins
    for S3."""
    try:
        old = {} if fresh else json.loads(read_private(s3_dir / PORTS_FILE, user))
    except (FileNotFoundError, ValueError):
        old = {}
    ports: dict[str, int] = {}
    for name in _LISTENERS:
        want = s3_port if name == "s3.port" and s3_port is not None else old.get(name)
        if isinstance(want, int) and want not in ports.values():
            if name == "s3.port" and s3_port is not None:
                check_port(want, "s3")
                ports[name] = want
                continue
            with contextlib.suppress(EmbeddedRuntimeError):
                check_port(want, "s3")
                ports[name] = want
                continue
        port = free_port()
        while port in ports.values():
            port = free_port()
        ports[name] = port
    write_private(s3_dir / PORTS_FILE, json.dumps(ports) + "\n", user)
    return ports


def write_if_changed(path: Path, text: str, user: StoreUser) -> None:
    try:
        if read_private(path, user) == text:
            return
    except FileNotFoundError:
        pass
    write_private(path, text, user)
