"""App-signed tokens (JWTs): every key kind is accepted where a token is, and each
refusal of the contract holds: expired, wrong issuer or audience, no exp, ``alg: none``,
an HMAC "signed" with a public key, an unknown or foreign kid, a revoked user's or a
deleted user's older tokens. The JWKS is served here, its fetches counted."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import http.server
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from im_server.client import ApiError, Client, ServerClient
from im_server.client.errors import ConnectionLost
from tests.support import ServerProcess, Stores, api_key, befriend, new_user

ISSUER = "https://accounts.app.example"
AUDIENCE = "im"
HS_SECRET = "an-hs256-secret-of-the-app-" + "x" * 20


def _pem(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class Keys:
    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()
        self.k1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.k2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Jwks:
    """A JWKS endpoint whose keys the test changes, counting its fetches."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}
        self.fetches = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = orjson.dumps(
                    {
                        "keys": [
                            {
                                **jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key(), as_dict=True),
                                "kid": kid,
                                "use": "sig",
                            }
                            for kid, k in outer.keys.items()
                        ]
                    }
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def jwks(keys: Keys) -> Iterator[Jwks]:
    j = Jwks()
    j.keys = {"k1": keys.k1}
    yield j
    j.close()


@pytest.fixture(scope="module")
def jwt_server(
    stores: Stores, keys: Keys, jwks: Jwks, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    pem = tmp_path_factory.mktemp("jwt") / "app-keys.pem"
    pem.write_bytes(_pem(keys.rsa) + _pem(keys.ec) + _pem(keys.ed))
    env = {
        **stores.env(),
        "IM_JWT_HS256_SECRET": HS_SECRET,
        "IM_JWT_PUBLIC_KEYS": str(pem),
        "IM_JWT_JWKS_URL": jwks.url,
        "IM_JWT_ISSUER": ISSUER,
        "IM_JWT_AUDIENCE": AUDIENCE,
        "IM_JWT_JWKS_REFETCH_SECONDS": "2",
        "IM_TOKEN_RECHECK_SECONDS": "1",
    }
    srv = ServerProcess(env=env).start()
    yield srv
    srv.terminate()


def sign(key: Any, alg: str, sub: str, kid: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    body: dict[str, Any] = {
        "sub": sub,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 300,
    }
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    headers = {"kid": kid} if kid else None
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def forged(header: dict[str, Any], claims: dict[str, Any], mac_key: bytes | None) -> str:
    """A token made by hand: ``alg: none`` (no signature), or an HMAC keyed by bytes
    the attacker knows (a public key's PEM)."""

    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(d)).rstrip(b"=").decode()

    head = f"{b64(header)}.{b64(claims)}"
    if mac_key is None:
        return head + "."
    sig = hmac.new(mac_key, head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def ext() -> str:
    return f"jwt-{uuid.uuid4().hex[:12]}"


async def me(url: str, token: str) -> dict[str, Any]:
    async with Client(url, token) as c:
        data: dict[str, Any] = await c.request("GET", "/v1/me")
        return data


async def socket_refused(url: str, token: str) -> bool:
    async with Client(url, token) as c:
        try:
            conn = await c.connect()
        except ApiError as e:
            return 400 <= e.status < 500  # 401; a URL too long for the server: 414
        try:
            return await conn.wait_closed(5) == 4401
        except ConnectionLost as e:
            return e.code == 4401


async def test_every_kind_of_key_signs_accepted_tokens(
    jwt_server: ServerProcess, keys: Keys
) -> None:
    url = jwt_server.url
    sub = ext()
    tokens = {
        "HS256": sign(HS_SECRET, "HS256", sub, name="Ann App"),
        "RS256 file": sign(keys.rsa, "RS256", sub),
        "PS256 file": sign(keys.rsa, "PS256", sub),
        "ES256 file": sign(keys.ec, "ES256", sub),
        "EdDSA file": sign(keys.ed, "EdDSA", sub),
        "RS256 JWKS": sign(keys.k1, "RS256", sub, kid="k1"),
    }
    seen = set()
    for what, token in tokens.items():
        got = await me(url, token)
        seen.add(got["user_id"])
        assert got["username"] == f"@{sub}", what
    assert len(seen) == 1  # created on first use, the same user after
    assert (await me(url, tokens["HS256"]))["display_name"] == "Ann App"


async def test_a_socket_on_an_app_token_lives_past_the_recheck(
    jwt_server: ServerProcess, keys: Keys
) -> None:
    url = jwt_server.url
    a, b = ext(), ext()
    ta, tb = sign(keys.ec, "ES256", a), sign(HS_SECRET, "HS256", b)
    async with Client(url, ta) as ca, Client(url, tb) as cb:
        ca.user_id = (await me(url, ta))["user_id"]
        cb.user_id = (await me(url, tb))["user_id"]
        conv = await befriend(ca, cb)
        sock = await cb.connect()
        await asyncio.sleep(3)  # the server re-checks its sockets' tokens every second
        assert not sock.closed.is_set()
        ack = await ca.send_rest(conv, {"text": "over a jwt"})
        ev = await sock.next_event("message", timeout=10)
        assert ev["message"]["seq"] == ack["seq"]


def _refusals(keys: Keys) -> dict[str, str]:
    sub = "jwt-refused-user"
    now = int(time.time())
    rsa_pem = _pem(keys.rsa)
    return {
        "expired": sign(HS_SECRET, "HS256", sub, exp=now - 5, iat=now - 100),
        "wrong issuer": sign(HS_SECRET, "HS256", sub, iss="https://evil.example"),
        "no issuer": sign(HS_SECRET, "HS256", sub, iss=None),
        "wrong audience": sign(HS_SECRET, "HS256", sub, aud="other"),
        "no exp": sign(HS_SECRET, "HS256", sub, exp=None),
        "no sub": jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "exp": now + 60}, HS_SECRET, algorithm="HS256"
        ),
        "bad sub": sign(HS_SECRET, "HS256", "has space"),
        "wrong secret": sign("another-secret-" + "y" * 30, "HS256", sub),
        "alg none": forged(
            {"alg": "none", "typ": "JWT"},
            {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60},
            None,
        ),
        "HS256 keyed by the public key": forged(
            {"alg": "HS256", "typ": "JWT"},
            {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60},
            rsa_pem,
        ),
        "HS256 keyed by the public key, kid": forged(
            {"alg": "HS256", "typ": "JWT", "kid": "k1"},
            {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60},
            rsa_pem,
        ),
        "RS256 by an unknown key": sign(keys.stranger, "RS256", sub),
        "RS256 by an unknown key, known kid": sign(keys.stranger, "RS256", sub, kid="k1"),
        "unknown kid": sign(keys.stranger, "RS256", sub, kid="nope"),
        "ES256 header on an RSA key": forged(
            {"alg": "ES256", "typ": "JWT", "kid": "k1"},
            {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60},
            b"x",
        ),
        "not yet valid": sign(HS_SECRET, "HS256", sub, nbf=now + 600),
        "garbage": "eyJhbGciOiJIUzI1NiJ9.e30.AAAA",
        "huge": "eyJ" + "A" * 10_000 + ".e30.AAAA",
    }


async def test_each_refusal(jwt_server: ServerProcess, keys: Keys) -> None:
    url = jwt_server.url
    for what, token in _refusals(keys).items():
        with pytest.raises(ApiError) as err:
            await me(url, token)
        assert err.value.status == 401, what
        assert await socket_refused(url, token), what


async def test_a_foreign_issuers_token_with_a_known_kid_is_refused(
    jwt_server: ServerProcess, keys: Keys
) -> None:
    # the JWKS key k1 belongs to the configured issuer: a token claiming another issuer
    # is not verified by it
    token = sign(keys.k1, "RS256", ext(), kid="k1", iss="https://other-tenant.example")
    with pytest.raises(ApiError) as err:
        await me(jwt_server.url, token)
    assert err.value.status == 401


async def test_unknown_kid_fetches_the_set_at_most_once_per_interval(
    jwt_server: ServerProcess, keys: Keys, jwks: Jwks
) -> None:
    url = jwt_server.url
    await asyncio.sleep(2.2)
    with pytest.raises(ApiError):
        await me(url, sign(keys.stranger, "RS256", ext(), kid="kX"))
    fetched = jwks.fetches
    jwks.keys["k2"] = keys.k2  # the app rotates: k2 appears
    sub = ext()
    for _ in range(10):
        with pytest.raises(ApiError):
            await me(url, sign(keys.k2, "RS256", sub, kid="k2"))
    assert jwks.fetches == fetched  # within the interval: no fetch however many ask
    await asyncio.sleep(2.2)
    got = await me(url, sign(keys.k2, "RS256", sub, kid="k2"))
    assert got["username"] == f"@{sub}"
    assert jwks.fetches == fetched + 1
    del jwks.keys["k2"]


async def test_revoke_tokens_refuses_older_app_tokens(
    jwt_server: ServerProcess, keys: Keys, stores: Stores
) -> None:
    url = jwt_server.url
    sub = ext()
    old = sign(keys.ed, "EdDSA", sub)
    no_iat = sign(HS_SECRET, "HS256", sub, iat=None)
    assert (await me(url, old))["username"] == f"@{sub}"
    assert (await me(url, no_iat))["username"] == f"@{sub}"
    async with Client(url, old) as c:
        sock = await c.connect()
        async with ServerClient(url, await api_key(stores, ["users"])) as app:
            await app.revoke_tokens(sub)
        assert await sock.wait_closed(10) == 4401
    for token in (old, no_iat):
        with pytest.raises(ApiError) as err:
            await me(url, token)
        assert err.value.status == 401
        assert await socket_refused(url, token)
    await asyncio.sleep(1.1)
    assert (await me(url, sign(keys.ed, "EdDSA", sub)))["username"] == f"@{sub}"


async def test_a_deleted_users_older_tokens_are_refused(
    jwt_server: ServerProcess, keys: Keys, stores: Stores
) -> None:
    url = jwt_server.url
    sub = ext()
    old = sign(HS_SECRET, "HS256", sub)
    first = (await me(url, old))["user_id"]
    async with ServerClient(url, await api_key(stores, ["users"])) as app:
        await app.delete_user(sub)
    with pytest.raises(ApiError) as err:
        await me(url, old)
    assert err.value.status == 401
    await asyncio.sleep(1.1)
    again = await me(url, sign(HS_SECRET, "HS256", sub))  # a new user of that id
    assert again["user_id"] != first


async def test_session_tokens_still_work_beside_app_tokens(jwt_server: ServerProcess) -> None:
    c = await new_user(jwt_server.url)
    assert (await c.request("GET", "/v1/me"))["user_id"] == c.user_id


def test_a_bad_key_file_stops_the_start(tmp_path: Path, stores: Stores) -> None:
    bad = tmp_path / "keys.pem"
    bad.write_text("not a key")
    srv = ServerProcess(env={**stores.env(), "IM_JWT_PUBLIC_KEYS": str(bad)})
    with pytest.raises(Exception):  # noqa: B017 - the start fails, whatever the wrapper
        srv.start(timeout=30)
    srv.terminate()
