"""A syncing device: a :class:`~im_server.client.Client`, its WebSocket and a
:class:`~im_server.client.sync.SyncState`, following the catch-up recipe of PROTOCOL.md
("Sync"): socket first, then sync, then pull the missing seq ranges."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from im_server.client.http import Client
from im_server.client.socket import Connection
from im_server.client.sync import SeqRange, SyncState
from im_server.client.wire import JsonObject

log = logging.getLogger("im_server.client")


class Device:
    """High level: a Client + Connection + SyncState implementing the recipe.

    ``start()`` opens the WebSocket first, so nothing sent after the sync snapshot can
    slip between the two; then :meth:`catch_up` syncs from the last version (looping
    while ``has_more``) and pulls the missing seq ranges with ``history()`` in ascending
    pages of at most ``page_size``. Pushed messages are stored as they arrive; one that
    skips seqs triggers a background pull of the gap. Every message is stored once, in
    :attr:`messages`, and reported once to ``on_message``.

    Only ``connect``, ``sync`` and ``history`` of the client are used, so a test may
    hand in a fake server with those three methods.
    """

    #: Delays between retries of a gap whose seqs are allocated but not persisted yet
    #: (``max_seq`` counts persisted messages only; a push can outrun the writer).
    GAP_RETRY_DELAYS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

    def __init__(
        self,
        client: Client,
        *,
        state: SyncState | None = None,
        recent: int | None = None,
        page_size: int = 200,
        on_message: Callable[[JsonObject], object] | None = None,
        queue_events: bool = True,
    ) -> None:
        self.client = client
        self.state = state or SyncState()
        self.conn: Connection | None = None
        self.recent = recent
        self.page_size = page_size
        self.on_message = on_message
        self.queue_events = queue_events
        self.messages: dict[str, dict[int, JsonObject]] = {}
        self.conversations: dict[str, JsonObject] = {}  # last sync state, sans messages
        self.errors: list[BaseException] = []  # failures of background gap pulls
        self._sync_lock = asyncio.Lock()
        self._pulls: set[asyncio.Task[int]] = set()

    async def start(self) -> None:
        self.conn = await self.client.connect(
            on_event=self._on_frame, queue_events=self.queue_events
        )
        await self.catch_up()

    async def catch_up(self) -> int:
        """Sync from the last version, pull what is missing; return how many messages
        were new to this device (pushes handled meanwhile are not counted)."""
        async with self._sync_lock:
            new = 0
            ranges: list[SeqRange] = []
            while True:
                since = self.state.version
                resp = await self.client.sync(since=since, recent=self.recent)
                ranges += self.state.apply_sync(resp)
                for st in resp.get("conversations") or []:
                    conv_id = st["conv_id"]
                    self.conversations[conv_id] = {k: v for k, v in st.items() if k != "messages"}
                    self._prune(conv_id)
                    new += self._store(self.state.add_messages(st.get("messages") or []))
                # a server that says has_more without moving on would loop forever
                if not resp.get("has_more") or self.state.version == since:
                    break
            for i, (conv_id, begin, end) in enumerate(ranges):
                try:
                    got, _ = await self._pull(conv_id, begin, end)
                except BaseException:
                    for later in ranges[i + 1 :]:
                        self.state.release(*later)
                    raise
                new += got
            return new

    async def drain(self) -> None:
        """Wait for the background gap pulls started by pushes."""
        while self._pulls:
            await asyncio.gather(*list(self._pulls), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*list(self._pulls), return_exceptions=True)
        if self.conn is not None:
            await self.conn.close()

    def seqs(self, conv_id: str) -> list[int]:
        """Sorted seqs held for a conversation (what a test compares with the server)."""
        return sorted(self.messages.get(conv_id, {}))

    # -- internals -------------------------------------------------------------------
    async def _pull(self, conv_id: str, begin: int, end: int) -> tuple[int, int | None]:
        """Fetch ``[begin, end]`` in ascending pages; return (new messages, first seq
        not available yet or None). A page must span at most ``limit`` seqs: when more
        remain the server keeps those nearest ``end``, not ``begin``."""
        new, cur = 0, begin
        try:
            while cur <= end:
                hi = min(end, cur + self.page_size - 1)
                ans = await self.client.history(
                    conv_id, begin=cur, end=hi, limit=self.page_size, order="asc"
                )
                self.state.observe_window(conv_id, min_seq=ans.get("min_seq"))
                self._prune(conv_id)
                new += self._store(self.state.add_messages(ans.get("messages") or []))
                top = ans.get("max_seq")
                covered = hi if top is None else min(hi, int(top))
                self.state.mark_pulled(conv_id, cur, covered)
                if covered < hi:  # the rest is allocated but not persisted (or not mine)
                    self.state.release(conv_id, covered + 1, end)
                    return new, covered + 1
                cur = hi + 1
        except BaseException:
            self.state.release(conv_id, cur, end)
            raise
        return new, None

    async def _pull_gap(self, conv_id: str, begin: int, end: int) -> int:
        new, rest = await self._pull(conv_id, begin, end)
        for delay in self.GAP_RETRY_DELAYS:
            if rest is None:
                break
            await asyncio.sleep(delay)
            claimed = self.state.claim(conv_id, rest, end)
            if claimed is None:
                break
            got, rest = await self._pull(*claimed)
            new += got
        return new

    def _on_frame(self, frame: JsonObject) -> None:
        if frame.get("type") != "message" or not isinstance(frame.get("message"), dict):
            return
        msg = frame["message"]
        self._store(self.state.add_messages([msg]))
        gap = self.state.on_push(msg)
        if gap is not None:
            task = asyncio.ensure_future(self._pull_gap(*gap))
            self._pulls.add(task)
            task.add_done_callback(self._pull_done)

    def _pull_done(self, task: asyncio.Task[int]) -> None:
        self._pulls.discard(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:
                self.errors.append(exc)

    def _store(self, msgs: list[Mapping[str, Any]]) -> int:
        for m in msgs:
            msg = dict(m)
            conv = self.messages.setdefault(msg["conv_id"], {})
            conv[int(msg["seq"])] = msg
            if msg.get("content_type") == "recall" and isinstance(msg.get("content"), dict):
                target = conv.get(int(msg["content"].get("seq", 0)))
                if target is not None:  # the original is blanked on the server too
                    target.update(content=None, recalled=True)
            if msg.get("content_type") == "edit" and isinstance(msg.get("content"), dict):
                self._apply_edit(conv, msg)
            if self.on_message is not None:
                try:
                    self.on_message(msg)
                except Exception:
                    log.exception("on_message callback failed")
        return len(msgs)

    @staticmethod
    def _apply_edit(conv: dict[int, dict[str, Any]], notice: Mapping[str, Any]) -> None:
        """An edit notice updates the held original (the server did the same)."""
        target = conv.get(int(notice["content"].get("seq", 0)))
        new = notice["content"].get("content")
        if target is None or target.get("recalled") or not isinstance(new, dict):
            return
        if (target.get("edited_at") or 0) <= int(notice["server_time"]):
            target.update(content=new, edited_at=int(notice["server_time"]))

    def _prune(self, conv_id: str) -> None:
        """Drop held messages below the window (cleared on another device...)."""
        held = self.messages.get(conv_id)
        floor = self.state.min_seq(conv_id)
        if held and min(held) < floor:
            self.messages[conv_id] = {s: m for s, m in held.items() if s >= floor}
