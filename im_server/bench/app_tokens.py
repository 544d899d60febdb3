"""What app-signed tokens cost a WebSocket connect, and what a user import takes.

    ./scripts/bench app_tokens [--connects 400] [--json]

It starts its own PostgreSQL, Redis and server (with an HS256 secret and an RSA public
key configured) in a temp folder and stops them at the end.

Measured, in one run, each connect with a token the server has not seen yet (its check
is not cached), one connect at a time: open the socket, wait for the accept, close it.
* session: a minted session token (one PostgreSQL read per connect), the baseline;
* HS256 / RS256: a JWT signed by the app, for one of 50 users who already exist;
* cached: the same session token again and again (the per-process cache answers).
For each: the connect's p50 / p99 latency and the server's CPU time per connect, with
the ratios to the session baseline. Then the server API's import of 1,000 and 10,000
users (new ones, each size three times; the median).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from im_server.bench.cluster import ServerProcess, Stores
from im_server.bench.common import make_api_key, report, run_with_server
from im_server.bench.read_storm import pct
from im_server.client import ServerClient

SECRET = "bench-hs256-secret-" + "s" * 24
SUBS = 50


def _ws_url(server: ServerProcess, token: str) -> str:
    return server.url.replace("http://", "ws://") + f"/v1/ws?token={token}"


async def _connects(
    http: aiohttp.ClientSession, server: ServerProcess, tokens: list[str]
) -> dict[str, float]:
    proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
    lat: list[float] = []
    cpu0 = sum(proc.cpu_times()[:2])
    for token in tokens:
        t0 = time.perf_counter()
        async with http.ws_connect(_ws_url(server, token)) as ws:
            lat.append(time.perf_counter() - t0)
            assert not ws.closed
        # the server may still be ending the socket: CPU counted over the whole phase
    await asyncio.sleep(0.2)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    ms = [x * 1000 for x in lat]
    return {
        "p50_ms": round(pct(ms, 50), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "cpu_ms_per_connect": round(cpu * 1000 / len(tokens), 3),
    }


def _jwt(key: Any, alg: str, sub: str) -> str:
    now = int(time.time())
    # a jti makes each token new to the server (its cache is keyed by the token)
    return jwt.encode(
        {"sub": sub, "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}, key, algorithm=alg
    )


async def bench(
    stores: Stores, server: ServerProcess, args: argparse.Namespace, rsa_key: Any, key: str
) -> dict[str, Any]:
    n = args.connects
    async with ServerClient(server.url, key) as app, aiohttp.ClientSession() as http:
        subs = [f"bench-{i}" for i in range(SUBS)]
        await app.import_users([{"external_id": s} for s in subs])
        minted = [
            (await app.mint_token(subs[i % SUBS], device_id=f"d{i}"))["token"] for i in range(n)
        ]
        warm = minted.pop()
        await _connects(http, server, [warm] * 20)  # pools and code paths warm
        for alg, k in (("HS256", SECRET), ("RS256", rsa_key)):  # users known, code warm
            await _connects(http, server, [_jwt(k, alg, s) for s in subs])
        phases = {
            "session": await _connects(http, server, minted[: n - 1]),
            "HS256": await _connects(
                http, server, [_jwt(SECRET, "HS256", subs[i % SUBS]) for i in range(n)]
            ),
            "RS256": await _connects(
                http, server, [_jwt(rsa_key, "RS256", subs[i % SUBS]) for i in range(n)]
            ),
            "cached": await _connects(http, server, [warm] * n),
        }
        base = phases["session"]
        for ph in phases.values():
            ph["p50_ratio"] = round(ph["p50_ms"] / base["p50_ms"], 2)
            ph["cpu_ratio"] = round(ph["cpu_ms_per_connect"] / base["cpu_ms_per_connect"], 2)
        imports: dict[str, float] = {}
        for size in (1_000, 10_000):
            runs = []
            for _ in range(3):
                run = uuid.uuid4().hex[:8]
                users = [
                    {"external_id": f"imp-{run}-{i}", "display_name": f"User {i}"}
                    for i in range(size)
                ]
                t0 = time.perf_counter()
                await app.import_users(users)
                runs.append(time.perf_counter() - t0)
            imports[f"import_{size}_s"] = round(statistics.median(runs), 3)
    return {"connects": n, "phases": phases, **imports}


def print_table(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"WebSocket connects with a token not seen before ({res['connects']} each)")
    for col in ("token", "p50 ms", "p99 ms", "server CPU ms/connect", "p50 ratio", "CPU ratio"):
        t.add_column(col)
    for name, ph in res["phases"].items():
        t.add_row(
            name,
            str(ph["p50_ms"]),
            str(ph["p99_ms"]),
            str(ph["cpu_ms_per_connect"]),
            f"{ph['p50_ratio']}x",
            f"{ph['cpu_ratio']}x",
        )
    Console().print(t)
    Console().print({k: v for k, v in res.items() if k.startswith("import")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./scripts/bench app_tokens", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--connects", type=int, default=400, help="connects per kind of token")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="im-bench-keys-"))
    pem = folder / "app.pem"
    pem.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    env = {"IM_JWT_HS256_SECRET": SECRET, "IM_JWT_PUBLIC_KEYS": str(pem)}

    async def with_key(stores: Stores, server: ServerProcess) -> dict[str, Any]:
        key = await make_api_key(stores.pg.url, ["all"], "bench")
        return await bench(stores, server, args, rsa_key, key)

    res = run_with_server("im-app-tokens-", with_key, env=env)
    report(res, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
