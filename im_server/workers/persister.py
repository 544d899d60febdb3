"""The persister: a consumer group on the message streams. Each batch is written in one
transaction (multi-row insert, ON CONFLICT DO NOTHING, so replays change nothing),
acknowledged (XACK + XDEL) only after the commit, and entries left pending by a
crashed consumer are reclaimed (XAUTOCLAIM) once idle long enough."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from im_server import metrics
from im_server.context import Context
from im_server.services import notify
from im_server.storage import messages
from im_server.storage.messages import NewMessage
from im_server.storage.redis import keys

log = logging.getLogger("im_server.persister")


def decode(fields: dict[str, str] | list[str]) -> NewMessage:
    if isinstance(fields, list):  # the raw reply: [name, value, name, value, ...]
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    return NewMessage(
        conv_id=fields["c"],
        seq=int(fields["q"]),
        sender_id=int(fields["s"]),
        client_msg_id=fields["m"],
        content_type=fields["t"],
        content_json=fields["b"],
        server_time=int(fields["ts"]),
    )


class Persister:
    def __init__(self, ctx: Context, consumer: str | None = None) -> None:
        self.ctx = ctx
        self.consumer = consumer or f"persister-{ctx.settings.node_name}"
        self.partitions = list(range(ctx.settings.stream_partitions))
        self._stop = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self.on_commit: list[Any] = []  # callbacks(batch) after each commit

    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="persister")

    async def stop(self, timeout: float = 5.0) -> None:
        """Finish the batch in hand, then stop."""
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            except Exception:  # noqa: BLE001
                log.exception("persister stopped with an error")

    async def run(self) -> None:
        backoff = 0.1
        first = True
        last_claim = 0.0
        while not self._stop.is_set():
            try:
                if first:
                    for p in self.partitions:
                        await self.ctx.redis.ensure_group(p)
                    # my own entries left pending by a previous run under the same name
                    await self._drain_pending()
                    first = False
                now = time.monotonic()
                if now - last_claim > self.ctx.settings.persister_claim_idle_ms / 2000:
                    last_claim = now
                    await self._reclaim()
                got = await self.ctx.redis.read_group(
                    self.partitions,
                    self.consumer,
                    self.ctx.settings.persister_batch,
                    min(self.ctx.settings.persister_block_ms, 500),
                )
                for stream_key, entries in got:
                    if entries:
                        await self._persist(stream_key, entries)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a store is down: retry with backoff
                if "NOGROUP" in str(e):
                    first = True  # Redis lost the group (flushed): make it again
                else:
                    log.warning("persister: %r; retrying in %.1f s", e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _drain_pending(self) -> None:
        while True:
            got = await self.ctx.redis.read_group(
                self.partitions, self.consumer, self.ctx.settings.persister_batch, 0, pending=True
            )
            done = True
            for stream_key, entries in got:
                live = [(i, f) for i, f in entries if f]
                if live:
                    await self._persist(stream_key, live)
                    done = False
                dead = [i for i, f in entries if not f]
                if dead:
                    await self.ctx.redis.ack(stream_key, dead)
            if done:
                return

    async def _reclaim(self) -> None:
        for p in self.partitions:
            while True:
                entries = await self.ctx.redis.autoclaim(
                    p,
                    self.consumer,
                    self.ctx.settings.persister_claim_idle_ms,
                    self.ctx.settings.persister_batch,
                )
                if not entries:
                    break
                log.info("reclaimed %d stale entries of partition %d", len(entries), p)
                await self._persist(keys.stream(p), entries)

    async def _check_conflicts(self, batch: list[NewMessage]) -> None:
        """Rows skipped by ON CONFLICT are normally replays (already stored, same seq). A
        skipped row whose seq is absent means its (sender, client_msg_id) was stored under
        another seq: a dedupe missed by Redis (its key expired or was lost)."""
        async with self.ctx.db.connect() as conn:
            missing = await messages.absent(conn, [(m.conv_id, m.seq) for m in batch])
        for conv_id, seq in missing:
            metrics.DEDUPE_CONFLICTS.inc()
            log.error(
                "message %s/%d repeats an older (sender, client_msg_id) and was not stored",
                conv_id,
                seq,
            )

    async def _persist(self, stream_key: str, entries: list[tuple[str, Any]]) -> None:
        batch: list[NewMessage] = []
        bad: list[str] = []
        for entry_id, fields in entries:
            try:
                batch.append(decode(fields))
            except (KeyError, ValueError):
                log.error("dropping malformed stream entry %s: %r", entry_id, fields)
                bad.append(entry_id)
        if batch:
            targets: set[tuple[str, int]] = set()
            for m in batch:
                if m.content_type == "recall":
                    target = orjson.loads(m.content_json).get("seq")
                    if isinstance(target, int):
                        targets.add((m.conv_id, target))
            here = {(m.conv_id, m.seq) for m in batch} & targets
            async with self.ctx.db.connect() as c:
                conn = await c.execution_options(isolation_level="AUTOCOMMIT")
                version, inserted = await messages.persist_batch(
                    conn, batch, here, sorted(targets - here)
                )
            now_ms = time.time() * 1000
            metrics.PERSISTED.inc(inserted)
            metrics.PERSIST_BATCH.observe(len(batch))
            for m in batch:
                metrics.PERSIST_LAG.observe(max(0.0, (now_ms - m.server_time) / 1000))
            if inserted < len(batch):
                await self._check_conflicts(batch)
            self.ctx.spawn(
                notify.conversations_changed(self.ctx, sorted({m.conv_id for m in batch}))
            )
            for cb in self.on_commit:
                try:
                    cb(batch, version)
                except Exception:  # noqa: BLE001
                    log.exception("on_commit callback failed")
        await self.ctx.redis.ack(stream_key, [i for i, _ in entries])
