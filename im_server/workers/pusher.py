"""The pusher: takes the durable push rows (``push_outbox``: messages, ``push_badge``:
badges to send again) in bounded rounds and posts their notifications to the push
gateway.

Rows are leased, not locked (no transaction stays open across HTTP calls), so any number
of processes run a pusher and a killed one's rows come back after
``IM_PUSH_LEASE_SECONDS``. A row is deleted only once every notification of it was
answered, so each (message, device) is posted at least once; a repeat (after a crash, or
for the users whose call failed) carries the same ``event_id``. Within one process the
(message, user) pairs already posted are remembered until their row is done, so a
gateway failing for some users repeats nothing for the others.

A failing gateway is retried with exponential back-off (0.5 s doubling up to
``IM_PUSH_BACKOFF_MAX_SECONDS``). Sends, acks and the persister never wait for any of
this: the persister only adds rows in the statement it runs anyway."""

from __future__ import annotations

import asyncio
import logging
import time

from im_server import metrics
from im_server.context import Context
from im_server.services import push
from im_server.services.push import MessageKey, Outgoing
from im_server.services.push_gateway import Answer, Gateway, Outcome
from im_server.storage import push as store
from im_server.storage import push_outbox as outbox_store
from im_server.workers.rounds import BACKOFF_MIN_S, RoundWorker

log = logging.getLogger("im_server.push")

POSTED_MAX = 100_000
NOTIFICATIONS_PER_ROUND = 20_000


class Pusher(RoundWorker):
    name = "pusher"

    def __init__(self, ctx: Context, gateway: Gateway | None = None) -> None:
        s = ctx.settings
        assert s.push_gateway_url is not None
        super().__init__(ctx.push_due, log)
        self.ctx = ctx
        self.gateway = gateway or Gateway(
            s.push_gateway_url.get_secret_value(), s.push_timeout_seconds, s.push_concurrency
        )
        self.backoff = 0.0  # seconds; 0 while the gateway answers
        # messages claimed per round: halved while rounds bring more notifications than
        # NOTIFICATIONS_PER_ROUND (big groups), grown back to push_batch after
        self.claim = s.push_batch
        self._posted: set[tuple[MessageKey, int]] = set()

    async def stop(self, timeout: float = 5.0) -> None:
        await super().stop(timeout)
        await self.gateway.close()

    def poll_seconds(self) -> float:
        return self.ctx.settings.push_poll_seconds

    def backoff_max_seconds(self) -> float:
        return self.ctx.settings.push_backoff_max_seconds

    def round_interval_seconds(self) -> float:
        return self.ctx.settings.push_round_interval_seconds

    def pause_after_round(self) -> float:
        return self.backoff  # the gateway failed: let it breathe

    async def round(self) -> bool:
        """Claim, post, settle one round; True when it found work."""
        s = self.ctx.settings
        now = _now_ms()
        lease_ms = int(s.push_lease_seconds * 1000)
        async with self.ctx.db.begin() as conn:
            rows = await outbox_store.claim_messages(conn, now, lease_ms, self.claim)
            badge_rows = await outbox_store.claim_badges(conn, now, lease_ms, s.push_batch)
        metrics.PHONE_PUSH_LAG.set(max(0, now - min(t for _, _, t in rows)) / 1000 if rows else 0)
        if not rows and not badge_rows:
            return False
        keys = [(c, q) for c, q, _ in rows]
        try:
            await self._work_and_post(keys, badge_rows)
        except BaseException:
            await self._give_back(keys, [u for u, _ in badge_rows])
            raise
        return True

    async def _give_back(self, keys: list[MessageKey], users: list[int]) -> None:
        """A round that failed on a store gives its rows back at once (not after the
        lease), when the database still answers."""
        try:
            async with self.ctx.db.begin() as conn:
                await outbox_store.release_messages(conn, keys, 0)
                await outbox_store.release_badges(conn, users, 0)
        except Exception as e:  # noqa: BLE001 - the store failed: the lease frees them later
            log.debug("pusher could not give its rows back: %r", e)

    async def _work_and_post(
        self, keys: list[MessageKey], badge_rows: list[tuple[int, int]]
    ) -> None:
        s = self.ctx.settings
        work = await push.message_work(self.ctx, keys) if keys else []
        work = [o for o in work if (o.key, o.user_id) not in self._posted]
        if len(work) > NOTIFICATIONS_PER_ROUND:
            self.claim = max(1, self.claim // 2)
        else:
            self.claim = min(s.push_batch, self.claim * 2)
        if badge_rows:
            work += await push.badge_work(self.ctx, [u for u, _ in badge_rows])
        answers = await self._post_all(work, deadline=time.monotonic() + s.push_lease_seconds / 2)
        await self._settle(keys, badge_rows, work, answers)

    async def _post_all(self, work: list[Outgoing], deadline: float) -> list[Answer]:
        """Post every notification, a bounded number at once. Past ``deadline`` (half the
        lease) the rest are left for the next round, before another pusher may take
        their rows."""
        gate = asyncio.Semaphore(self.ctx.settings.push_concurrency)

        async def one(o: Outgoing) -> Answer:
            async with gate:
                if time.monotonic() > deadline:
                    return Answer(Outcome.RETRY)
                a = await self.gateway.notify(o.notification)
            kind = "badge" if o.key is None else "message"
            metrics.PHONE_PUSHES.labels(kind, a.outcome.value).inc()
            if o.key is not None and a.outcome is Outcome.SENT:
                metrics.PHONE_PUSH_LATENCY.observe(max(0.0, time.time() - o.server_time / 1000))
            return a

        return list(await asyncio.gather(*(one(o) for o in work)))

    async def _settle(
        self,
        keys: list[MessageKey],
        badge_rows: list[tuple[int, int]],
        work: list[Outgoing],
        answers: list[Answer],
    ) -> None:
        s = self.ctx.settings
        failed_keys: set[MessageKey] = set()
        failed_users: set[int] = set()
        rejected: list[tuple[str, str]] = []
        gateway_failed = False
        for o, a in zip(work, answers, strict=True):
            if a.outcome is Outcome.RETRY:
                gateway_failed = True
                if o.key is None:
                    failed_users.add(o.user_id)
                else:
                    failed_keys.add(o.key)
                continue
            if o.key is not None:
                self._posted.add((o.key, o.user_id))
            if a.rejected:
                dead = set(a.rejected)
                rejected += [
                    (d["app_id"], d["pushkey"])
                    for d in o.notification["devices"]
                    if d["pushkey"] in dead
                ]
        if gateway_failed:
            self.backoff = min(max(BACKOFF_MIN_S, self.backoff * 2), s.push_backoff_max_seconds)
        else:
            self.backoff = 0.0
        metrics.PHONE_PUSH_BACKOFF.set(self.backoff)
        now = _now_ms()
        retry_at = now + int(self.backoff * 1000)
        done_keys = [k for k in keys if k not in failed_keys]
        done_badges = [(u, g) for u, g in badge_rows if u not in failed_users]
        async with self.ctx.db.begin() as conn:
            if rejected:
                n = await store.delete_pushkeys(conn, rejected)
                metrics.PHONE_PUSH_REJECTED.inc(len(rejected))
                log.info(
                    "push gateway rejected %d pushkeys; %d registrations deleted", len(rejected), n
                )
            await outbox_store.finish_messages(conn, done_keys)
            await outbox_store.release_messages(conn, sorted(failed_keys), retry_at)
            await outbox_store.finish_badges(
                conn, done_badges, now + int(s.push_badge_coalesce_seconds * 1000)
            )
            await outbox_store.release_badges(conn, sorted(failed_users), retry_at)
        done = set(done_keys)
        self._posted = {p for p in self._posted if p[0] not in done}
        if len(self._posted) > POSTED_MAX:  # rows another pusher took over and finished
            self._posted.clear()


def _now_ms() -> int:
    return int(time.time() * 1000)
