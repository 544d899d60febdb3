"""The HTTP side of pushing: one ``POST`` of a notification to the gateway, and what its
answer means for the pusher (done, rejected pushkeys, try again later, or give up).

The gateway URL may carry credentials, so it is never logged; nor are pushkeys (a
device's address for APNs/FCM), only how many there were."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import orjson
from pydantic import ValidationError

from im_server.protocol.push_gateway import NOTIFY_ANSWER, NOTIFY_PATH, Notification

log = logging.getLogger("im_server.push")


class Outcome(enum.Enum):
    SENT = "sent"
    RETRY = "retry"  # the gateway is down, slow or overloaded: try again after a back-off
    DROPPED = "dropped"  # the gateway refused the request itself (4xx): a retry would too


@dataclass(slots=True)
class Answer:
    outcome: Outcome
    rejected: list[str] = field(default_factory=list)


def notify_url(url: str) -> str:
    """``IM_PUSH_GATEWAY_URL`` as given, or with the API's path when it has none."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return url.rstrip("/") + NOTIFY_PATH
    return url


class Gateway:
    """A pooled HTTP client for one push gateway (aiohttp, the project's one HTTP client
    library: a burst to a big group is thousands of POSTs)."""

    def __init__(self, url: str, timeout: float, concurrency: int) -> None:
        self.url = notify_url(url)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._concurrency),
                timeout=self._timeout,
                headers={"Content-Type": "application/json"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def notify(self, n: Notification) -> Answer:
        try:
            async with self._http().post(self.url, data=orjson.dumps({"notification": n})) as resp:
                status = resp.status
                body = await resp.read() if status == 200 else b""
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.debug("push gateway unreachable: %s", type(e).__name__)
            return Answer(Outcome.RETRY)
        if status == 200:
            try:
                answer = NOTIFY_ANSWER.validate_json(body)
            except ValidationError:
                answer = {}  # delivered; an answer we cannot read rejects nothing
            return Answer(
                Outcome.SENT, [k for k in answer.get("rejected", []) if isinstance(k, str)]
            )
        if 400 <= status < 500 and status not in (408, 429):
            log.warning("push gateway refused a notification: HTTP %d", status)
            return Answer(Outcome.DROPPED)
        return Answer(Outcome.RETRY)
