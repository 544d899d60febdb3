"""App-signed token checks without a server: which algorithms each key verifies, what a
JWKS yields, what the verifier refuses and why, the JWKS fetch bound (against a local
HTTP server, no stores)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from im_server.context.app_tokens import (
    AppTokenRefused,
    AppTokens,
    KeysUnavailable,
    algorithms_of,
    load_public_keys,
    parse_jwks,
)

RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
P256 = ec.generate_private_key(ec.SECP256R1())
P384 = ec.generate_private_key(ec.SECP384R1())
K256 = ec.generate_private_key(ec.SECP256K1())
ED = ed25519.Ed25519PrivateKey.generate()


def pem(key: Any) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def token(key: Any, alg: str, **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "u-1", "iat": now, "exp": now + 60, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=alg)


def test_each_key_type_verifies_its_own_algorithms_only() -> None:
    assert algorithms_of(RSA.public_key()) == {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
    assert algorithms_of(P256.public_key()) == {"ES256"}
    assert algorithms_of(P384.public_key()) == {"ES384"}
    assert algorithms_of(ED.public_key()) == {"EdDSA"}
    assert algorithms_of(K256.public_key()) == frozenset()  # not offered
    assert algorithms_of(b"secret") == frozenset()


def test_key_files(tmp_path: Path) -> None:
    f = tmp_path / "keys.pem"
    f.write_bytes(pem(RSA) + b"\n" + pem(P256) + pem(ED))
    assert len(load_public_keys(f)) == 3
    f.write_text("nothing here")
    with pytest.raises(ValueError, match="no PEM public key"):
        load_public_keys(f)
    f.write_bytes(pem(K256))
    with pytest.raises(ValueError, match="not RSA"):
        load_public_keys(f)


def _jwk(key: Any, **extra: Any) -> dict[str, Any]:
    pub = key.public_key()
    if isinstance(pub, rsa.RSAPublicKey):
        d = jwt.algorithms.RSAAlgorithm.to_jwk(pub, as_dict=True)
    elif isinstance(pub, ec.EllipticCurvePublicKey):
        d = jwt.algorithms.ECAlgorithm.to_jwk(pub, as_dict=True)
    else:
        d = jwt.algorithms.OKPAlgorithm.to_jwk(pub, as_dict=True)
    return {**d, **extra}


def test_jwks_keeps_public_signing_keys_with_a_kid() -> None:
    private = jwt.algorithms.RSAAlgorithm.to_jwk(RSA, as_dict=True)
    keys = parse_jwks(
        orjson.dumps(
            {
                "keys": [
                    _jwk(RSA, kid="r"),
                    _jwk(P256, kid="e"),
                    _jwk(ED, kid="d"),
                    _jwk(RSA, kid="only-ps", alg="PS256"),
                    _jwk(RSA),  # no kid
                    {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},  # symmetric: never
                    {**private, "kid": "private"},  # a private key published by mistake
                    {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
                    "not an object",
                ]
            }
        )
    )
    assert set(keys) == {"r", "e", "d", "only-ps"}
    assert keys["only-ps"][1] == {"PS256"}
    assert keys["e"][1] == {"ES256"}
    with pytest.raises(ValueError):
        parse_jwks(b'{"no": "keys"}')


async def test_verifier_refusals() -> None:
    v = AppTokens(
        hs256_secret=b"s" * 32, public_keys=[RSA.public_key()], issuer="iss", audience="aud"
    )

    async def why(t: str) -> str:
        with pytest.raises(AppTokenRefused) as e:
            await v.verify(t)
        return str(e.value)

    good = {"iss": "iss", "aud": "aud"}
    assert (await v.verify(token(b"s" * 32, "HS256", **good))).sub == "u-1"
    assert (await v.verify(token(RSA, "RS256", **good))).sub == "u-1"
    assert await why(token(b"s" * 32, "HS256", iss="x", aud="aud")) == "wrong issuer"
    assert await why(token(b"s" * 32, "HS256", iss="iss", aud="x")) == "wrong audience"
    assert await why(token(b"s" * 32, "HS256", exp=None, **good)) == "missing claim 'exp'"
    assert await why(token(b"s" * 32, "HS256", exp=1, **good)) == "token expired"
    assert await why(token(b"t" * 32, "HS256", **good)) == "bad signature"
    assert "no configured key" in await why(token(P256, "ES256", **good))
    assert "no configured key" in await why(token(b"s" * 48, "HS384", **good))
    assert (await why(token(b"s" * 32, "HS256", sub="a b", **good))).startswith("sub:")
    assert await why("eyJ.not.jwt") == "malformed token"
    none = jwt.encode({"sub": "u", "exp": int(time.time()) + 60, **good}, None, algorithm="none")
    assert "no configured key" in await why(none)
    # an HS256 token whose secret is the RSA public key's PEM: no key of the verifier
    # is an HMAC secret for it (the secret configured is another), so it fails
    assert await why(token(b"x" * 32, "HS256", **good)) == "bad signature"
    assert AppTokens().configured is False
    assert AppTokens.looks_like_jwt(token(b"s" * 32, "HS256")) is True
    assert AppTokens.looks_like_jwt("abcDEF_-123") is False


async def test_jwks_fetch_is_bounded_and_scoped_to_its_set() -> None:
    served: dict[str, Any] = {"keys": [_jwk(RSA, kid="k1")]}
    fetches = 0

    async def jwks(request: web.Request) -> web.Response:
        nonlocal fetches
        fetches += 1
        return web.json_response(served)

    app = web.Application()
    app.router.add_get("/jwks", jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        v = AppTokens(jwks_url=f"http://127.0.0.1:{port}/jwks", refetch_s=0.5)
        ok = jwt.encode(
            {"sub": "u", "exp": int(time.time()) + 60},
            RSA,
            algorithm="RS256",
            headers={"kid": "k1"},
        )
        assert (await v.verify(ok)).sub == "u"
        assert fetches == 1
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        k2 = jwt.encode(
            {"sub": "u", "exp": int(time.time()) + 60},
            other,
            algorithm="RS256",
            headers={"kid": "k2"},
        )
        served["keys"].append(_jwk(other, kid="k2"))
        await asyncio.sleep(0.6)
        results = await asyncio.gather(*(v.verify(k2) for _ in range(20)))
        assert all(r.sub == "u" for r in results)
        assert fetches == 2  # twenty at once: one fetch
        with pytest.raises(AppTokenRefused):
            await v.verify(
                jwt.encode(
                    {"sub": "u", "exp": int(time.time()) + 60},
                    other,
                    algorithm="RS256",
                    headers={"kid": "k3"},
                )
            )
        assert fetches == 2  # within the interval: none
        # a key under kid k1 does not verify a token whose kid names k2
        swapped = jwt.encode(
            {"sub": "u", "exp": int(time.time()) + 60},
            RSA,
            algorithm="RS256",
            headers={"kid": "k2"},
        )
        with pytest.raises(AppTokenRefused):
            await v.verify(swapped)
    finally:
        await runner.cleanup()
    dead = AppTokens(jwks_url=f"http://127.0.0.1:{port}/jwks")
    with pytest.raises(KeysUnavailable):
        await dead.verify(ok)
