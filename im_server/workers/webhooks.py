"""The webhook deliverer: every server process runs one; they share the outbox.

Each round claims due queue heads (the oldest pending delivery of a (webhook,
conversation)), at most ``IM_WEBHOOK_CONCURRENCY`` per webhook in flight here, and
drains each claimed queue: deliver, mark delivered and claim the next row of the same
queue in one transaction, deliver that... until the queue is empty or a delivery fails.
So events of one conversation go out one at a time, in order, each after the previous
one was acknowledged; different conversations and webhooks go out side by side, and a
slow or dead receiver holds only its own slots (sends, acks and pushes never wait for
any of this).

A failed attempt (no 2xx, a timeout, a refused address) is retried after a back-off
with jitter (``IM_WEBHOOK_RETRY_BASE_SECONDS`` doubling, at most an hour) until
``IM_WEBHOOK_RETRY_HOURS`` after the event, then marked failed; a failed delivery no
longer holds its queue. A claim is a lease longer than a delivery's timeout: when the
process dies, another one takes the row after the lease (at least once: it may have
been delivered just before the crash)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

import aiohttp
import orjson

from im_server import metrics
from im_server.context import Context
from im_server.protocol import webhook_signing
from im_server.services import outbound
from im_server.storage import webhooks as store
from im_server.storage.db import now_ms
from im_server.storage.webhooks import Delivery, Signing

log = logging.getLogger("im_server.webhooks")

READ_MAX = 64 * 1024  # of a receiver's answer
BACKOFF_MAX_S = 3600.0


def backoff_s(base: float, attempts: int) -> float:
    """The wait before attempt ``attempts + 1``: doubling from ``base``, at most an hour,
    with ±20 % jitter so many queues failing together do not retry together."""
    return float(min(base * 2.0 ** max(attempts - 1, 0), BACKOFF_MAX_S)) * random.uniform(0.8, 1.2)


def body_of(d: Delivery) -> bytes:
    return orjson.dumps({"type": d.type, "timestamp": d.created_at, "data": d.data})


class WebhookDeliverer:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.per_webhook = max(1, s.webhook_concurrency)
        # longer than a delivery can take: a live claim is never taken by another process
        self.lease_ms = int((2 * s.webhook_timeout_seconds + 5) * 1000)
        self._in_flight: dict[int, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[Any] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._signing: dict[int, tuple[float, Signing]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhooks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            s = self.ctx.settings
            connector = aiohttp.TCPConnector(
                resolver=outbound.GuardedResolver(s.webhook_allow_private), limit=0
            )
            self._http = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=s.webhook_timeout_seconds),
                auto_decompress=False,
            )
        return self._http

    async def _run(self) -> None:
        poll = self.ctx.settings.webhook_poll_seconds
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a store is down: try again next round
                log.warning("webhook round failed: %r", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ctx.webhooks_due.wait(), poll)
            self.ctx.webhooks_due.clear()

    async def round(self) -> int:
        """Claim due queue heads and start draining them; how many were claimed."""
        now = now_ms()
        async with self.ctx.db.begin() as conn:
            heads = await store.claim_heads(conn, now, now + self.lease_ms, 256)
        extra: list[int] = []
        for d in heads:
            if self._in_flight.get(d.webhook_id, 0) >= self.per_webhook:
                extra.append(d.delivery_id)  # this webhook's slots are full here
                continue
            self._in_flight[d.webhook_id] = self._in_flight.get(d.webhook_id, 0) + 1
            task = asyncio.create_task(self._drain(d))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if extra:
            async with self.ctx.db.begin() as conn:
                await store.release(conn, extra)
        return len(heads) - len(extra)

    async def _drain(self, d: Delivery | None) -> None:
        assert d is not None
        webhook_id = d.webhook_id
        try:
            while d is not None:
                error = await self._deliver(d)
                now = now_ms()
                if error is None:
                    metrics.WEBHOOK_DELIVERIES.labels(str(webhook_id), "delivered").inc()
                    metrics.WEBHOOK_LAG.labels(str(webhook_id)).observe(
                        max(0.0, (now - d.created_at) / 1000)
                    )
                    async with self.ctx.db.begin() as conn:
                        d = await store.delivered_then_next(conn, d, now, now + self.lease_ms)
                    continue
                s = self.ctx.settings
                give_up = now - d.created_at > s.webhook_retry_hours * 3_600_000
                wait = backoff_s(s.webhook_retry_base_seconds, d.attempts + 1)
                outcome = "failed" if give_up else "retry"
                metrics.WEBHOOK_DELIVERIES.labels(str(webhook_id), outcome).inc()
                async with self.ctx.db.begin() as conn:
                    await store.attempt_failed(
                        conn, d.delivery_id, now + int(wait * 1000), error, give_up
                    )
                if give_up:
                    log.warning(
                        "webhook %d: %s failed for good: %s", webhook_id, d.event_key, error
                    )
                return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the store: the lease runs out, another round retries
            log.warning("webhook %d: delivery bookkeeping failed: %r", webhook_id, e)
        finally:
            self._in_flight[webhook_id] -= 1

    async def _signing_of(self, webhook_id: int) -> Signing | None:
        """The webhook's URL and secrets, kept a few seconds (a rotation or a deletion
        shows within them)."""
        hit = self._signing.get(webhook_id)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        async with self.ctx.db.connect() as conn:
            found = (await store.signing(conn, [webhook_id], now_ms())).get(webhook_id)
        if found is not None:
            self._signing[webhook_id] = (time.monotonic() + 5.0, found)
        return found

    async def _deliver(self, d: Delivery) -> str | None:
        """POST the event; None when acknowledged (2xx), else why not."""
        target = await self._signing_of(d.webhook_id)
        if target is None:
            return "the webhook was deleted"
        body = body_of(d)
        headers = webhook_signing.headers(target.secrets, d.event_key, int(time.time()), body)
        try:
            outbound.check_url(target.url, self.ctx.settings.webhook_allow_private)
            async with self._session().post(
                target.url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                await resp.content.read(READ_MAX)  # bounded: the answer is not used
                if 200 <= resp.status < 300:
                    return None
                return f"HTTP {resp.status}"
        except outbound.RefusedAddress as e:
            return str(e)
        except TimeoutError:
            return "timed out"
        except (aiohttp.ClientError, OSError) as e:
            return f"{type(e).__name__}: {e}"[:300]
        except Exception as e:  # noqa: BLE001 - check_url's refusal and the like
            return f"{type(e).__name__}: {e}"[:300]
