"""The before-send hook's client: one per process, with its circuit breaker.

Each call is a signed POST (the webhooks' scheme, keyed by ``IM_BEFORE_SEND_SECRET``)
bounded by ``IM_BEFORE_SEND_TIMEOUT_MS``; calls run side by side, each awaited by its
own send only. After ``IM_BEFORE_SEND_BREAKER_FAILURES`` failures in a row (no answer
in time, an error status, an answer that is not JSON) the circuit opens for
``IM_BEFORE_SEND_BREAKER_SECONDS``: sends take the failure policy at once, without a
call. After the window one call goes through (the others still take the policy): its
success closes the circuit, its failure opens it for another window. So a dead hook
costs one timeout per window, not one per send."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from im_server.context.batching import Coalescer
from im_server.protocol import webhook_signing

READ_MAX = 256 * 1024

Outcome = Literal["answered", "failed", "breaker_open"]


@dataclass
class BeforeSendHook:
    url: str | None = None
    secret: str | None = None
    timeout_s: float = 1.0
    breaker_failures: int = 5
    breaker_s: float = 10.0
    _failures: int = 0
    _open_until: float = 0.0
    _trial: bool = False
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)
    # the kept decisions, read and written for many sends at once (one Redis pipeline)
    reads: Coalescer[tuple[int, str], bytes | None] | None = field(default=None, repr=False)
    keeps: Coalescer[tuple[int, str, bytes, int], bytes] | None = field(default=None, repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.url)

    def _admit(self) -> bool | None:
        """True: call (False: a half-open trial call); None: the circuit is open."""
        if self._open_until == 0.0:
            return True
        if time.monotonic() < self._open_until or self._trial:
            return None
        self._trial = True
        return False

    def _result(self, ok: bool, trial: bool) -> None:
        if trial:
            self._trial = False
        if ok:
            self._failures, self._open_until = 0, 0.0
            return
        self._failures += 1
        if trial or self._failures >= self.breaker_failures:
            self._open_until = time.monotonic() + self.breaker_s

    async def ask(self, msg_id: str, body: bytes) -> tuple[Outcome, dict[str, Any] | None]:
        admitted = self._admit()
        if admitted is None:
            return "breaker_open", None
        answer = await self._call(msg_id, body)
        self._result(answer is not None, trial=not admitted)
        return ("answered", answer) if answer is not None else ("failed", None)

    async def _call(self, msg_id: str, body: bytes) -> dict[str, Any] | None:
        assert self.url
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        if self.secret:
            headers = webhook_signing.headers([self.secret], msg_id, int(time.time()), body)
        else:
            headers = {"content-type": "application/json", "webhook-id": msg_id}
        try:
            async with self._http.post(
                self.url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                raw = await resp.content.read(READ_MAX + 1)
                if not 200 <= resp.status < 300 or len(raw) > READ_MAX:
                    return None
            answer = orjson.loads(raw)
        except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return None
        except asyncio.CancelledError:
            raise
        return answer if isinstance(answer, dict) else None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
