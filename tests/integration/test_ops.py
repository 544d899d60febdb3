"""Operations: /healthz, /readyz, /metrics, and a Redis outage (degrade, do not crash,
recover by itself)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from im_server.client import ApiError, Client
from im_server.client.transport import HttpPool, Response, TransportError
from im_server.runtime.embedded import start_redis
from tests.support import ServerProcess, Stores, befriend, eventually, new_user


async def get(url: str, path: str, timeout: float = 10.0) -> Response:
    async with HttpPool(timeout=timeout) as http:
        return await http.get(url + path)


async def test_healthz(url: str) -> None:
    resp = await get(url, "/healthz")
    assert resp.status_code == 200


async def test_readyz_with_both_stores(url: str) -> None:
    resp = await get(url, "/readyz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ready", "postgres": True, "redis": True}
    alive = await get(url, "/healthz")
    assert alive.status_code == 200 and alive.json() == {"status": "ok"}


def sends_total(text: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^im_sends_total(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


async def test_metrics_prometheus_text(pair: tuple[Client, Client, str], url: str) -> None:
    alice, _, conv = pair
    before = await get(url, "/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    n0 = sends_total(before.text)

    ack = await alice.send_rest(conv, "metrics please")
    assert ack["ok"] is True

    after = await get(url, "/metrics")
    assert after.status_code == 200
    text = after.text
    assert "# TYPE im_sends_total counter" in text
    assert re.search(r"^im_sends_total\{[^}]*\} [0-9.eE+-]+$", text, re.M), (
        "no im_sends_total sample"
    )
    assert sends_total(text) >= n0 + 1
    # every non-comment line is a Prometheus sample: name{labels} value
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? \S+( \d+)?$", line), line


async def _status(url: str, path: str) -> int | None:
    try:
        return (await get(url, path, timeout=5.0)).status_code
    except TransportError:
        return None


async def test_redis_outage_degrades_and_recovers(tmp_path: Path) -> None:
    stores = Stores.start(tmp_path / "s")
    srv: ServerProcess | None = None
    clients: list[Client] = []
    try:
        srv = ServerProcess(env=stores.env()).start()
        url = srv.url
        alice, bob = await new_user(url, "oa"), await new_user(url, "ob")
        clients += [alice, bob]
        conv = await befriend(alice, bob)
        first = await alice.send_rest(conv, "before the outage")
        assert first["ok"] is True and first["seq"] == 1

        port = stores.redis.port
        stores.redis.stop()

        # /readyz notices within a few seconds; /healthz stays 200
        t0 = time.monotonic()

        async def not_ready() -> bool:
            return await _status(url, "/readyz") == 503

        await eventually(not_ready, timeout=5.0, interval=0.1)
        assert time.monotonic() - t0 < 5.0
        assert await _status(url, "/healthz") == 200

        # a send fails fast with 503 unavailable
        t0 = time.monotonic()
        with pytest.raises(ApiError) as exc:
            await alice.send_rest(conv, "during the outage")
        elapsed = time.monotonic() - t0
        assert exc.value.status == 503 and exc.value.code == "unavailable", exc.value
        assert elapsed < 5.0, f"the refused send took {elapsed:.1f} s"

        # the process is still up and still answering
        assert srv.proc is not None and srv.proc.poll() is None
        assert await _status(url, "/healthz") == 200
        assert await _status(url, "/readyz") == 503
        down = await get(url, "/readyz")
        assert down.json() == {"status": "unavailable", "postgres": True, "redis": False}

        # Redis comes back on the same port: the server recovers by itself
        stores.redis = start_redis(stores.root / "redis", port)

        async def ready() -> bool:
            return await _status(url, "/readyz") == 200

        await eventually(ready, timeout=15.0, interval=0.1)

        async def send_ok() -> dict | None:
            try:
                return await alice.send_rest(conv, "after the outage")
            except ApiError:
                return None

        again = await eventually(send_ok, timeout=5.0, interval=0.2)
        assert again["ok"] is True and again["seq"] > first["seq"]  # never reused

        async def persisted() -> bool:
            data = await bob.history(conv)
            return again["seq"] in [m["seq"] for m in data["messages"]]

        await eventually(persisted, timeout=15.0)
        assert srv.proc.poll() is None
    finally:
        for c in clients:
            await c.aclose()
        if srv is not None:
            srv.terminate()
        stores.stop()
