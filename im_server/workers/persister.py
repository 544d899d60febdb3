"""The persister: a consumer group on the message streams. Each batch is written in one
transaction (multi-row insert, ON CONFLICT DO NOTHING, so replays change nothing),
acknowledged (XACK + XDEL) only after the commit, and entries left pending by a
crashed consumer are reclaimed (XAUTOCLAIM) once idle long enough."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import asyncpg

from im_server import metrics
from im_server.context import Context
from im_server.services import edits, notify, recall
from im_server.storage import edits as edit_store
from im_server.storage import messages
from im_server.storage.messages import NewMessage, Persisted
from im_server.storage.redis import keys

log = logging.getLogger("im_server.persister")


class MalformedEntry(ValueError):
    """A stream entry that is not one written by ``send_batch.lua``."""


def decode(fields: Mapping[str, str] | list[str]) -> NewMessage:
    """A stream entry as ``send_batch.lua`` writes it, ``{q: seq, d: <fields joined by
    NUL>}`` (conv_id, sender_id, client_msg_id, content_type, content, server_time, then
    two flags the persister does not need, then, only for a send that mentions or
    replies, mentions (comma-joined ids), mention_all ("1"/"0") and reply_to), given as a mapping or as the raw reply ``[name,
    value, name, value, ...]``. Anything else raises :class:`MalformedEntry`, saying why."""
    if isinstance(fields, list):
        if len(fields) % 2:
            raise MalformedEntry(f"{len(fields)} names and values (not pairs)")
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    elif not isinstance(fields, Mapping):
        raise MalformedEntry(f"a {type(fields).__name__}, not a list or a mapping")
    seq, data = fields.get("q"), fields.get("d")
    if not isinstance(seq, str) or not isinstance(data, str):
        raise MalformedEntry("no q (seq) or d (message) field")
    parts = data.split("\0")
    if len(parts) < 6:
        raise MalformedEntry(f"d holds {len(parts)} of 6 fields")
    conv_id, sender, cmid, ctype, content, ts = parts[:6]
    try:
        msg = NewMessage(conv_id, int(seq), int(sender), cmid, ctype, content, int(ts))
        if len(parts) >= 11:  # a send with mentions or a reply: see store.encode_extras
            mentions, mention_all, reply_to = parts[8:11]
            msg.mentions = [int(u) for u in mentions.split(",")] if mentions else []
            msg.mention_all = mention_all == "1"
            msg.reply_to = int(reply_to) if reply_to else None
    except ValueError:
        raise MalformedEntry(
            "seq, sender, server time, a mention or reply_to is not an integer"
        ) from None
    return msg


class Persister:
    def __init__(self, ctx: Context, consumer: str | None = None) -> None:
        self.ctx = ctx
        self.consumer = consumer or f"persister-{ctx.settings.node_name}"
        self.partitions = list(range(ctx.settings.partitions))
        self._stop = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self.held: set[int] = set()  # partitions whose lease this persister holds
        self._reads: dict[int, asyncio.Task[Any]] = {}  # a blocking read per held partition
        self._pg: asyncpg.Connection | None = None  # the write connection, outside the pool

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
            except Exception:
                log.exception("persister stopped with an error")

    async def run(self) -> None:
        """Hold the lease of each partition it can get (one persister per partition at a
        time keeps a conversation's batches in seq order, so a persisted max_seq never
        jumps over a message still on its way); on taking a partition over, first store
        every entry left pending by the previous holder, oldest first."""
        s = self.ctx.settings
        ttl = s.persister_claim_idle_ms
        backoff = 0.1
        groups_ready = False
        retry_pending = False
        last_lease = 0.0
        last_map = time.monotonic()
        while not self._stop.is_set():
            try:
                if not groups_ready:
                    for p in self.partitions:
                        await self.ctx.redis.ensure_group(p)
                    groups_ready = True
                now = time.monotonic()
                if self.ctx.redis.cluster and now - last_map > s.redis_map_refresh_seconds:
                    last_map = now
                    await self.ctx.redis.refresh_map()
                if now - last_lease > ttl / 3000:
                    last_lease = now
                    for p in self.partitions:
                        if await self.ctx.redis.lease(p, self.consumer, ttl):
                            if p not in self.held:
                                log.info("persister %s took partition %d", self.consumer, p)
                                await self._take_over(p)
                                self.held.add(p)
                        elif p in self.held:
                            log.warning("persister %s lost partition %d", self.consumer, p)
                            self.held.discard(p)
                if not self.held:
                    await asyncio.sleep(min(ttl / 3000, 0.5))
                    continue
                if retry_pending:  # a batch failed: it is still pending here; redo it first
                    for p in sorted(self.held):
                        await self._take_over(p)
                    retry_pending = False
                got = await self._read_held()
                for stream_key, entries in got:
                    if entries:
                        await self._persist(stream_key, entries)
                backoff = 0.1
            except asyncio.CancelledError:
                self._cancel_reads(set())
                raise
            except Exception as e:  # noqa: BLE001 - a store is down: retry with backoff
                retry_pending = True
                self._cancel_reads(set())  # the retry starts from what is pending here
                if "NOGROUP" in str(e):
                    groups_ready = False  # Redis lost the group (flushed): make it again
                    self.held.clear()
                else:
                    log.warning("persister: %r; retrying in %.1f s", e, backoff)
                    if self.ctx.redis.cluster:  # a primary gone: learn who serves now
                        await self.ctx.redis.refresh_map(force=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self._cancel_reads(set())
        for p in list(self.held):
            try:
                await self.ctx.redis.lease(p, self.consumer, ttl, release=True)
            except Exception:  # noqa: BLE001 - it expires by itself
                pass
        self.held.clear()
        if self._pg is not None:
            await self._pg.close()
            self._pg = None

    async def _read_held(self) -> list[tuple[str, list[Any]]]:
        """New entries of the held partitions: one blocking XREADGROUP per partition (a
        read over several streams crosses slots on a Cluster), all in flight at once and
        kept from one round to the next; returns once some have answered. Entries a
        read took but nobody stored stay pending here: a failure redoes them
        (``retry_pending``), a partition taken over by another persister claims them."""
        s = self.ctx.settings
        self._cancel_reads(self.held)
        for p in self.held:
            if p not in self._reads:
                self._reads[p] = asyncio.create_task(
                    self.ctx.redis.read_group(
                        [p], self.consumer, s.persister_batch, min(s.persister_block_ms, 500)
                    ),
                    name=f"persister-read-{p}",
                )
        done, _ = await asyncio.wait(self._reads.values(), return_when=asyncio.FIRST_COMPLETED)
        out: list[tuple[str, list[Any]]] = []
        for p, task in list(self._reads.items()):
            if task in done:
                del self._reads[p]
                out.extend(task.result())  # a failed read raises: the caller retries
        return out

    def _cancel_reads(self, keep: set[int]) -> None:
        """Drop the reads of the partitions not in ``keep`` (lost, or stopping)."""
        for p in [p for p in self._reads if p not in keep]:
            self._reads.pop(p).cancel()

    async def _take_over(self, partition: int) -> None:
        """Claim and store everything pending in the partition (any consumer's), in order."""
        start = "0-0"
        while True:
            start, entries = await self.ctx.redis.autoclaim(
                partition, self.consumer, 0, self.ctx.settings.persister_batch, start
            )
            if not entries and start == "0-0":
                return
            live = [(i, f) for i, f in entries if f]
            log.info(
                "persister %s stores %d pending entries of partition %d",
                self.consumer,
                len(live),
                partition,
            )
            if live:
                await self._persist(keys.stream(partition), live)
            dead = [i for i, f in entries if not f]
            if dead:
                await self.ctx.redis.ack(keys.stream(partition), dead)
            if start == "0-0":
                return

    async def _write(
        self, batch: list[NewMessage], here: set[tuple[str, int]], blank: list[tuple[str, int]]
    ) -> Persisted:
        if self._pg is None or self._pg.is_closed():
            self._pg = await asyncpg.connect(self.ctx.settings.database_dsn, timeout=5)
        try:
            return await messages.persist_batch(
                self._pg, batch, here, blank, push=self.ctx.settings.push_enabled
            )
        except asyncpg.DataError:
            raise
        except BaseException:
            pg, self._pg = self._pg, None  # unknown state: start over on a new connection
            pg.terminate()
            raise

    async def _apply_edits(self, batch: list[NewMessage]) -> None:
        """The edits of the batch's edit notices, after the batch committed (the
        originals are stored before: an edit is sent only once its original is)."""
        found = [e for e in map(edits.edit_of, batch) if e is not None]
        if not found:
            return
        assert self._pg is not None
        try:
            await edit_store.apply_pg(self._pg, found)
        except BaseException:
            pg, self._pg = self._pg, None
            pg.terminate()
            raise

    async def _touch_filled_windows(self, batch: list[NewMessage]) -> list[int]:
        assert self._pg is not None
        try:
            return await messages.touch_filled_windows(self._pg, batch)
        except BaseException:
            pg, self._pg = self._pg, None
            pg.terminate()
            raise

    async def _write_one_by_one(
        self,
        batch: list[NewMessage],
        here: set[tuple[str, int]],
        blank: list[tuple[str, int]],
        err: Exception,
    ) -> Persisted:
        """A batch the database refused as data (not as an outage): write it row by row
        so one bad entry cannot hold the others back; a row refused on its own is stored
        with its content replaced, keeping its seq, sender and client_msg_id (an acked
        message is never dropped), and counted."""
        log.error("persister: batch of %d refused (%r); writing it row by row", len(batch), err)
        version = inserted = pushed = hooked = 0
        for m in batch:
            try:
                version, n, p, h = await self._write([m], here, blank)
            except asyncpg.DataError as e:
                metrics.PERSIST_POISON.inc()
                log.error(
                    "message %s/%d refused by the database (%r): content replaced",
                    m.conv_id,
                    m.seq,
                    e,
                )
                stub = NewMessage(
                    m.conv_id,
                    m.seq,
                    m.sender_id,
                    m.client_msg_id,
                    m.content_type,
                    '{"unstorable": true}',
                    m.server_time,
                )
                version, n, p, h = await self._write([stub], here, blank)
            inserted += n
            pushed += p
            hooked += h
        return Persisted(version, inserted, pushed, hooked)

    async def _check_conflicts(self, batch: list[NewMessage]) -> None:
        """Rows skipped by ON CONFLICT are normally replays (already stored, same seq). A
        skipped row whose seq is absent means its (sender, client_msg_id) was stored under
        another seq: a dedupe missed by Redis (its key expired or was lost). A skipped row
        whose seq holds another message (a seq handed out twice) gives its dedupe key
        back."""
        async with self.ctx.db.begin() as conn:
            missing = await messages.absent(conn, [(m.conv_id, m.seq) for m in batch])
            taken = await messages.release_taken_keys(conn, batch)
        for conv_id, seq in taken:
            log.error("message %s/%d not stored: its seq holds another message", conv_id, seq)
        for conv_id, seq in missing:
            metrics.DEDUPE_CONFLICTS.inc()
            log.error(
                "message %s/%d repeats an older (sender, client_msg_id) and was not stored",
                conv_id,
                seq,
            )

    async def _persist(self, stream_key: str, entries: list[tuple[str, Any]]) -> None:
        batch: list[NewMessage] = []
        for entry_id, fields in entries:
            try:
                batch.append(decode(fields))
            except MalformedEntry as e:
                log.error("dropping malformed stream entry %s (%s): %r", entry_id, e, fields)
        if batch:
            blank = recall.blanking(batch)
            try:
                done = await self._write(batch, blank.in_batch, blank.earlier)
            except asyncpg.DataError as e:
                done = await self._write_one_by_one(batch, blank.in_batch, blank.earlier, e)
            inserted, pushed = done.inserted, done.pushed
            now_ms = time.time() * 1000
            metrics.PERSISTED.inc(inserted)
            if pushed:  # wake this process's pusher only when there is something to push
                self.ctx.push_due.set()
            if done.hooked:  # and its webhook deliverer
                self.ctx.webhooks_due.set()
            metrics.PERSIST_BATCH.observe(len(batch))
            for m in batch:
                metrics.PERSIST_LAG.observe(max(0.0, (now_ms - m.server_time) / 1000))
            if inserted < len(batch):
                await self._check_conflicts(batch)
            await self._apply_edits(batch)
            touched = await self._touch_filled_windows(batch)
            if touched:
                self.ctx.spawn(notify.changed(self.ctx, touched))
            self.ctx.spawn(
                notify.conversations_changed(self.ctx, sorted({m.conv_id for m in batch}))
            )
        await self.ctx.redis.ack(stream_key, [i for i, _ in entries])
