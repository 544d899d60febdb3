"""The Standard Webhooks signature: the scheme's published test vector, an independent
implementation of the spec, several signatures in one header, and the SSRF address
rules (no network)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from im_server.errors import ImError
from im_server.protocol import webhook_signing as ws
from im_server.services import outbound


def test_published_test_vector() -> None:
    # from the Standard Webhooks specification's reference libraries
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    got = ws.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _spec_sign(secret: str, msg_id: str, ts: int, body: bytes) -> str:
    """The spec, written again here: key = base64-decoded part after whsec_."""
    key = base64.b64decode(secret.split("_", 1)[1])
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_headers_carry_one_signature_per_secret() -> None:
    new, old = ws.new_secret(), ws.new_secret()
    assert new.startswith("whsec_") and len(base64.b64decode(new[6:])) == 32
    body = b'{"type":"message.created"}'
    h = ws.headers((new, old), "msg_1", 1700000000, body)
    assert h["webhook-id"] == "msg_1" and h["webhook-timestamp"] == "1700000000"
    assert h["webhook-signature"].split(" ") == [
        _spec_sign(new, "msg_1", 1700000000, body),
        _spec_sign(old, "msg_1", 1700000000, body),
    ]
    sig = h["webhook-signature"]
    assert ws.verify(old, "msg_1", "1700000000", sig, body, now=1700000010)
    assert not ws.verify(old, "msg_1", "1700000000", sig, body + b" ", now=1700000010)
    assert not ws.verify(old, "msg_1", "1700000000", sig, body, now=1700009999)  # too old
    assert not ws.verify(ws.new_secret(), "msg_1", "1700000000", sig, body, now=1700000000)


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "100.64.0.1",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::",
    ],
)
def test_refused_addresses(ip: str) -> None:
    assert outbound.address_refused(ip)


@pytest.mark.parametrize("ip", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses(ip: str) -> None:
    assert not outbound.address_refused(ip)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://[::1]:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/hook",
        "http://[::ffff:127.0.0.1]/",
        "ftp://example.com/",
        "http://user:pw@example.com/",
        "not a url",
        "http:///nohost",
        "https://example.com:99999/",
        "http://" + "a" * 3000 + ".com/",
    ],
)
def test_refused_urls(url: str) -> None:
    with pytest.raises(ImError):
        outbound.check_url(url, allow_private=False)


def test_private_allowed_when_configured() -> None:
    assert outbound.check_url("http://127.0.0.1:9/x", allow_private=True) == ("127.0.0.1", 9)
    assert outbound.check_url("https://example.com/x", allow_private=False) == ("example.com", 443)
