"""The Standard Webhooks signing scheme (standardwebhooks.com, v1), used for webhook
deliveries and for the before-send hook's calls.

A secret is ``whsec_`` + base64 of 32 random bytes; the HMAC key is the decoded bytes.
The signature is ``v1,`` + base64 of HMAC-SHA256 over ``<id>.<timestamp>.<body>``;
several (a rotation's old and new secret) go in one header, separated by spaces. Pure
functions: no I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of a secret: the base64 after ``whsec_``; a secret in another form
    (an operator's own string) is used as its UTF-8 bytes."""
    if secret.startswith(PREFIX):
        try:
            return base64.b64decode(secret[len(PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            pass
    return secret.encode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    mac = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(
    secrets_: tuple[str, ...] | list[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three headers of a signed request (one signature per secret)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets_),
        "content-type": "application/json",
    }


def verify(
    secret: str,
    msg_id: str,
    timestamp: str,
    signature_header: str,
    body: bytes,
    now: int,
    tolerance_s: int = 300,
) -> bool:
    """Whether one of the header's signatures is ``secret``'s, within the tolerance (a
    receiver's check; used by the example bot)."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now - ts) > tolerance_s:
        return False
    want = sign(secret, msg_id, ts, body)
    return any(hmac.compare_digest(want, s) for s in signature_header.split())
