"""Catch-up arithmetic for one client device: :class:`SyncState`, pure logic, no I/O.

The contract (PROTOCOL.md, "Sync") promises that a client which keeps calling
``/v1/sync`` with the last ``version`` and then pulls the seq ranges it lacks misses
nothing and receives nothing twice. Pushed ``message`` frames arrive on the WebSocket in
parallel and may skip seqs (a frame lost while reconnecting, or a push racing a pull).
:class:`SyncState` is the arithmetic behind that recipe, kept free of I/O so that it can
be tested exhaustively and reused by any client (the test device, the benchmark, the
terminal chat). :class:`~im_server.client.device.Device` drives it over the network.

* ``apply_sync(answer)`` records the new version and each conversation's visible window
  and returns the ranges ``(conv_id, begin, end)`` to pull with ``history()``;
* ``add_messages(msgs)`` keeps only the messages not held yet (dedup by ``(conv_id,
  seq)``);
* ``on_push(message)`` returns the gap to pull when a pushed seq skips over seqs not
  held;
* ``mark_pulled`` / ``release`` close the loop once a pull has finished or failed.

Ranges handed out are remembered as *requested* until they are marked pulled or
released, so that a push arriving while a pull is in flight, or a second sync page
naming the same conversation, does not pull the same seqs twice.

A pulled range may come back with holes: seqs can be skipped for good after the Redis
data is lost. ``mark_pulled`` therefore records the range as *resolved*: whatever is
not held inside it does not exist for this user, and the range is never asked again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SeqRange = tuple[str, int, int]
"""``(conv_id, begin, end)``, both ends inclusive, as ``history(begin=, end=)`` takes them."""

Interval = tuple[int, int]


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged copy of inclusive intervals (adjacent ones are joined)."""
    out: list[Interval] = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1] + 1:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((b, e))
    return out


def _subtract(intervals: list[Interval], begin: int, end: int) -> list[Interval]:
    """``intervals`` with ``[begin, end]`` taken out."""
    out: list[Interval] = []
    for b, e in intervals:
        if e < begin or b > end:
            out.append((b, e))
            continue
        if b < begin:
            out.append((b, begin - 1))
        if e > end:
            out.append((end + 1, e))
    return out


def _complement(lo: int, hi: int, blocked: Iterable[Interval]) -> list[Interval]:
    """The parts of ``[lo, hi]`` not covered by any ``blocked`` interval."""
    out: list[Interval] = []
    cur = lo
    for b, e in _merge(blocked):
        if e < cur:
            continue
        if b > hi:
            break
        if b > cur:
            out.append((cur, b - 1))
        cur = e + 1
        if cur > hi:
            break
    if cur <= hi:
        out.append((cur, hi))
    return out


@dataclass
class ConvCursor:
    """What one device knows about one conversation.

    ``contiguous`` is the highest seq such that every seq in ``[min_seq, contiguous]``
    is held or known not to exist; it only ever moves through held or resolved seqs,
    which lets the common case (the next push is ``contiguous + 1``) stay O(1).
    """

    min_seq: int = 1
    max_seq: int = 0
    contiguous: int = 0
    seqs: set[int] = field(default_factory=set)
    ahead: set[int] = field(default_factory=set)  # held seqs above ``contiguous``
    resolved: list[Interval] = field(default_factory=list)
    requested: list[Interval] = field(default_factory=list)
    window_known: bool = False  # False until a sync state or history answer told us

    def advance(self) -> None:
        """Move ``contiguous`` forward through held seqs and resolved ranges."""
        while True:
            nxt = self.contiguous + 1
            if nxt in self.ahead:
                self.ahead.discard(nxt)
                self.contiguous = nxt
                continue
            for b, e in self.resolved:
                if b <= nxt <= e:
                    self.contiguous = e
                    break
            else:
                break
        self.ahead = {s for s in self.ahead if s > self.contiguous} if self.ahead else self.ahead
        self.resolved = [(b, e) for b, e in self.resolved if e > self.contiguous]

    def missing(self, lo: int, hi: int, also_held: Iterable[int] = ()) -> list[Interval]:
        """Seqs in ``[lo, hi]`` neither held, resolved, requested nor in ``also_held``."""
        lo = max(lo, self.contiguous + 1, self.min_seq)
        if lo > hi:
            return []
        blocked: list[Interval] = [(s, s) for s in self.ahead if lo <= s <= hi]
        blocked += [(s, s) for s in also_held if lo <= s <= hi]
        blocked += self.resolved
        blocked += self.requested
        return _complement(lo, hi, blocked)

    def set_window(self, min_seq: int | None, max_seq: int | None) -> None:
        """Adopt the server's view of my visible window.

        A raised ``min_seq`` (cleared, removed, re-joined) drops what lies below it. A
        lowered one (never expected by the contract, handled anyway) reopens the range
        below the old bound: everything there is pulled again as new.
        """
        if min_seq is not None:
            min_seq = max(1, int(min_seq))
            if min_seq > self.min_seq or not self.window_known:
                self._raise_min(min_seq)
            elif min_seq < self.min_seq:
                self.min_seq = min_seq
                self.contiguous = min_seq - 1
                self.resolved = []
                self.ahead = {s for s in self.seqs if s > self.contiguous}
                self.advance()
            self.window_known = True
        if max_seq is not None:
            self.max_seq = int(max_seq)

    def _raise_min(self, min_seq: int) -> None:
        if min_seq > self.min_seq:
            self.seqs = {s for s in self.seqs if s >= min_seq}
            self.ahead = {s for s in self.ahead if s >= min_seq}
            self.requested = _subtract(self.requested, 0, min_seq - 1)
        self.min_seq = max(self.min_seq, min_seq)
        if self.contiguous < self.min_seq - 1:
            self.contiguous = self.min_seq - 1
        self.advance()


class SyncState:
    """Client-side catch-up state: last sync version plus one :class:`ConvCursor` per
    conversation. See the module docstring for the recipe it implements."""

    def __init__(self, version: int = 0) -> None:
        self.version: int = version
        self.has_more: bool = False
        self.convs: dict[str, ConvCursor] = {}

    # -- queries -------------------------------------------------------------------
    def cursor(self, conv_id: str) -> ConvCursor:
        """The conversation's cursor, created empty (window unknown) on first use."""
        cur = self.convs.get(conv_id)
        if cur is None:
            cur = self.convs[conv_id] = ConvCursor()
        return cur

    def held(self, conv_id: str, seq: int) -> bool:
        cur = self.convs.get(conv_id)
        return cur is not None and seq in cur.seqs

    def __contains__(self, key: object) -> bool:
        """``(conv_id, seq) in state``: the message is held."""
        if not (isinstance(key, tuple) and len(key) == 2):
            return False
        return self.held(key[0], key[1])

    def min_seq(self, conv_id: str) -> int:
        cur = self.convs.get(conv_id)
        return cur.min_seq if cur else 1

    def contiguous(self, conv_id: str) -> int:
        """Highest seq up to which this conversation has no hole."""
        cur = self.convs.get(conv_id)
        return cur.contiguous if cur else 0

    # -- sync answers ----------------------------------------------------------------
    def apply_sync(self, resp: Mapping[str, Any]) -> list[SeqRange]:
        """Take one ``/v1/sync`` answer; return the ranges to pull with ``history()``.

        The seqs of the messages embedded in the answer are left out of the ranges: the
        caller stores them through :meth:`add_messages` (before or after this call).
        The returned ranges are marked requested; report each with :meth:`mark_pulled`
        once fetched, or :meth:`release` when the fetch failed.
        """
        ranges: list[SeqRange] = []
        for st in resp.get("conversations") or []:
            conv_id = st["conv_id"]
            cur = self.cursor(conv_id)
            cur.set_window(st.get("min_seq"), st.get("max_seq"))
            embedded = [m["seq"] for m in st.get("messages") or [] if "seq" in m]
            for b, e in cur.missing(cur.min_seq, cur.max_seq, embedded):
                cur.requested = _merge([*cur.requested, (b, e)])
                ranges.append((conv_id, b, e))
        version = resp.get("version")
        if version is not None:
            self.version = max(self.version, int(version))
        self.has_more = bool(resp.get("has_more", False))
        return ranges

    def observe_window(
        self, conv_id: str, min_seq: int | None = None, max_seq: int | None = None
    ) -> None:
        """Correct the window from a ``history()`` answer (its "real bounds").

        Only ever raises ``min_seq``, which is safe whether the answer's bound is mine
        or the conversation's (never above mine). ``max_seq`` only grows: the answer
        counts persisted messages and may trail what a push already showed.
        """
        cur = self.cursor(conv_id)
        if min_seq is not None and (int(min_seq) > cur.min_seq or not cur.window_known):
            cur._raise_min(max(1, int(min_seq)))
            cur.window_known = True
        if max_seq is not None and int(max_seq) > cur.max_seq:
            cur.max_seq = int(max_seq)

    # -- messages --------------------------------------------------------------------
    def add_messages(self, msgs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Record messages; return only those not held before, in input order.

        Messages below the conversation's ``min_seq`` are not visible to me any more
        (cleared on another device, for instance) and are dropped as well.
        """
        new: list[Mapping[str, Any]] = []
        for m in msgs:
            seq = int(m["seq"])
            cur = self.cursor(m["conv_id"])
            if seq in cur.seqs or seq < cur.min_seq:
                continue
            cur.seqs.add(seq)
            if seq == cur.contiguous + 1:
                cur.contiguous = seq
                if cur.ahead or cur.resolved:
                    cur.advance()
            elif seq > cur.contiguous:
                cur.ahead.add(seq)
            new.append(m)
        return new

    def on_push(self, message: Mapping[str, Any]) -> SeqRange | None:
        """The gap to pull when a pushed message skips over seqs not held, else None.

        The gap runs from the first missing seq (never below ``min_seq``) to the last
        missing seq before the pushed one; held seqs inside it are simply returned
        again by ``history()`` and dropped by :meth:`add_messages`. The pushed message
        itself is not recorded here: pass it to :meth:`add_messages` as well. The
        returned range is marked requested.
        """
        conv_id = message["conv_id"]
        seq = int(message["seq"])
        if seq <= self.contiguous(conv_id) + 1:
            return None
        return self.claim(conv_id, 1, seq - 1)

    def claim(self, conv_id: str, begin: int, end: int) -> SeqRange | None:
        """One range spanning the seqs of ``[begin, end]`` that are neither held,
        resolved nor requested (None if there are none); marks them requested."""
        cur = self.cursor(conv_id)
        holes = cur.missing(begin, end)
        if not holes:
            return None
        cur.requested = _merge([*cur.requested, *holes])
        return (conv_id, holes[0][0], holes[-1][1])

    # -- pull outcome ----------------------------------------------------------------
    def mark_pulled(self, conv_id: str, begin: int, end: int) -> None:
        """``history()`` answered for all of ``[begin, end]``: whatever it did not
        return there does not exist for me (a seq gap, or outside my window)."""
        if begin > end:
            return
        cur = self.cursor(conv_id)
        cur.requested = _subtract(cur.requested, begin, end)
        lo = max(begin, cur.contiguous + 1)
        if lo <= end:
            cur.resolved = _merge([*cur.resolved, (lo, end)])
            cur.advance()

    def release(self, conv_id: str, begin: int, end: int) -> None:
        """Give a requested range back (the pull failed or the seqs are not persisted
        yet), so that a later sync or push asks for it again."""
        if begin > end:
            return
        cur = self.cursor(conv_id)
        cur.requested = _subtract(cur.requested, begin, end)

    def missing(self, conv_id: str) -> list[SeqRange]:
        """Ranges up to the known ``max_seq`` that are neither held nor requested.

        Marks them requested, like :meth:`apply_sync`; used to retry released ranges
        without waiting for the next change in the conversation.
        """
        cur = self.cursor(conv_id)
        holes = cur.missing(cur.min_seq, cur.max_seq)
        if holes:
            cur.requested = _merge([*cur.requested, *holes])
        return [(conv_id, b, e) for b, e in holes]
