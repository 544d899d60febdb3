"""Tokens the app signs itself (JWTs), checked against the keys the server is given.

PyJWT does the JOSE work: it is maintained, typed, parses JWK sets and refuses an HMAC
check with an asymmetric key. What it leaves to us is which algorithms each key may
verify, and where keys come from:

* each key verifies only the algorithms of its own type (an HS256 secret: HS256; an RSA
  key: RS*/PS*; an EC key: the ES* of its curve; Ed25519: EdDSA), so ``alg: none`` and
  an HMAC "signed" with a public key find no key at all;
* a JWKS is fetched by this module (aiohttp, bounded in time and size), not by PyJWT's
  synchronous client, whose cache is keyed by ``kid`` alone: here the key set belongs to
  the one configured issuer and is looked up by ``kid`` inside it. A ``kid`` it has not
  seen makes it fetch the set again, at most once a minute; the set is also refreshed
  every ten minutes, so a key taken out of the set stops working.

``exp`` and ``sub`` are required; ``iss`` and ``aud`` must match when configured. The
caller (``services/accounts``) turns ``sub`` into a user and applies the user's
"revoke every token before" time to ``iat``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

log = logging.getLogger("im_server.app_tokens")

EXTERNAL_ID = re.compile(r"^[A-Za-z0-9_.@:-]{1,128}$")
DEVICE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
TOKEN_MAX = 8192  # characters; a JWT longer than this is refused before it is parsed
JWKS_REFETCH_S = 60.0  # an unknown kid fetches the set again at most this often
JWKS_MAX_AGE_S = 600.0
JWKS_MAX_BYTES = 256 * 1024

_RSA_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALGS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


class AppTokenRefused(Exception):
    """The token is not accepted; the message says why (no secret in it)."""


class KeysUnavailable(Exception):
    """The key set could not be fetched and no copy of it is at hand."""


@dataclass(frozen=True, slots=True)
class Claims:
    sub: str
    name: str | None
    iat: int | None  # seconds
    exp: int  # seconds
    device_id: str | None


def algorithms_of(key: object) -> frozenset[str]:
    """The algorithms a public key may verify: those of its type, and nothing else."""
    if isinstance(key, rsa.RSAPublicKey):
        return _RSA_ALGS
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGS.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()


def load_public_keys(path: Path) -> list[Any]:
    """Every PEM public key in the file (RSA, EC or Ed25519); a file without one, or
    with a key of another type, is a configuration error."""
    text = path.read_text()
    blocks = re.findall(r"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", text, re.S)
    keys = [load_pem_public_key(b.encode()) for b in blocks]
    if not keys:
        raise ValueError(f"{path}: no PEM public key (-----BEGIN PUBLIC KEY-----)")
    for k in keys:
        if not algorithms_of(k):
            raise ValueError(f"{path}: a key that is not RSA, EC (P-256/384/521) or Ed25519")
    return keys


@dataclass
class AppTokens:
    """The configured keys of app-signed tokens; one per process."""

    hs256_secret: bytes | None = None
    public_keys: list[Any] = field(default_factory=list)
    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = 0.0
    refetch_s: float = JWKS_REFETCH_S
    _jwks: dict[str, tuple[Any, frozenset[str]]] = field(default_factory=dict)
    _fetched_at: float = float("-inf")
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fetches: int = 0

    @property
    def configured(self) -> bool:
        return bool(self.hs256_secret or self.public_keys or self.jwks_url)

    @staticmethod
    def looks_like_jwt(token: str) -> bool:
        """A JWT is three base64url parts and starts with the encoded ``{"``; a session
        token has no dot."""
        return token.startswith("eyJ") and token.count(".") == 2

    async def verify(self, token: str) -> Claims:
        if len(token) > TOKEN_MAX:
            raise AppTokenRefused("token too long")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AppTokenRefused("malformed token") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str):
            raise AppTokenRefused("no algorithm")
        keys = await self._keys_for(alg, kid)
        if not keys:
            raise AppTokenRefused(f"no configured key verifies {alg[:16]!r} tokens")
        last: Exception | None = None
        for key in keys:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    audience=self.audience,
                    issuer=self.issuer,
                    leeway=self.leeway_s,
                    options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
                )
            except jwt.InvalidSignatureError as e:
                last = e
                continue
            except jwt.PyJWTError as e:
                raise AppTokenRefused(_why(e)) from None
            return _claims(claims)
        raise AppTokenRefused(_why(last) if last else "bad signature")

    async def _keys_for(self, alg: str, kid: object) -> list[Any]:
        if alg == "HS256":
            return [self.hs256_secret] if self.hs256_secret else []
        keys = [k for k in self.public_keys if alg in algorithms_of(k)]
        if self.jwks_url and isinstance(kid, str) and len(kid) <= 256:
            found = await self._jwks_key(kid)
            if found is not None and alg in found[1]:
                keys.append(found[0])
        return keys

    async def _jwks_key(self, kid: str) -> tuple[Any, frozenset[str]] | None:
        now = time.monotonic()
        stale = now - self._fetched_at > JWKS_MAX_AGE_S
        if kid not in self._jwks or stale:
            async with self._lock:
                now = time.monotonic()
                may = now - self._fetched_at >= self.refetch_s
                if may and (kid not in self._jwks or now - self._fetched_at > JWKS_MAX_AGE_S):
                    await self._fetch()
        return self._jwks.get(kid)

    async def _fetch(self) -> None:
        """Fetch the set; on failure the copy at hand stays (none: ``KeysUnavailable``)."""
        assert self.jwks_url
        self._fetched_at = time.monotonic()
        self.fetches += 1
        try:
            timeout = aiohttp.ClientTimeout(total=5.0)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.get(self.jwks_url, allow_redirects=False) as resp:
                    if resp.status != 200:
                        raise ValueError(f"HTTP {resp.status}")
                    body = await resp.content.read(JWKS_MAX_BYTES + 1)
            if len(body) > JWKS_MAX_BYTES:
                raise ValueError("key set over 256 KiB")
            self._jwks = parse_jwks(body)
        except Exception as e:
            log.warning("fetching the JWKS failed: %r", e)
            if not self._jwks:
                raise KeysUnavailable("the app's key set cannot be fetched now") from e


def parse_jwks(body: bytes | str) -> dict[str, tuple[Any, frozenset[str]]]:
    """kid -> (public key, algorithms it may verify). Keys without a kid, symmetric keys
    and private keys are left out; a key with an ``alg`` verifies only that one."""
    raw = orjson.loads(body)
    if not isinstance(raw, dict) or not isinstance(raw.get("keys"), list):
        raise ValueError("not a JWK set")
    out: dict[str, tuple[Any, frozenset[str]]] = {}
    for item in raw["keys"]:
        if not isinstance(item, dict) or item.get("kty") == "oct" or "d" in item:
            continue  # symmetric, or a private key published by mistake: never used
        kid = item.get("kid")
        if not isinstance(kid, str) or not kid:
            continue
        try:
            key = jwt.PyJWK(item).key
        except jwt.PyJWTError:
            continue  # a key type or curve not supported: the others still work
        algs = algorithms_of(key)
        if isinstance(item.get("alg"), str):
            algs = algs & {item["alg"]}
        if algs:
            out[kid] = (key, algs)
    return out


def _why(e: Exception) -> str:
    if isinstance(e, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(e, jwt.InvalidIssuerError):
        return "wrong issuer"
    if isinstance(e, jwt.InvalidAudienceError):
        return "wrong audience"
    if isinstance(e, jwt.MissingRequiredClaimError):
        return f"missing claim {e.claim!r}"
    if isinstance(e, jwt.ImmatureSignatureError):
        return "token not yet valid"
    if isinstance(e, jwt.InvalidSignatureError):
        return "bad signature"
    return "invalid token"


def _claims(c: dict[str, Any]) -> Claims:
    sub, name, iat, exp = c.get("sub"), c.get("name"), c.get("iat"), c.get("exp")
    if not isinstance(sub, str) or not EXTERNAL_ID.fullmatch(sub):
        raise AppTokenRefused("sub: 1-128 characters of [A-Za-z0-9_.@:-]")
    if not isinstance(exp, int) or isinstance(exp, bool):
        raise AppTokenRefused("exp: an integer")
    if iat is not None and (not isinstance(iat, int) or isinstance(iat, bool)):
        raise AppTokenRefused("iat: an integer")
    device = c.get("device_id")
    return Claims(
        sub,
        name if isinstance(name, str) else None,
        iat,
        exp,
        device if isinstance(device, str) and DEVICE_ID.fullmatch(device) else None,
    )
