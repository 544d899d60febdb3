"""Search: the messages of a user's conversations whose tokens match a query, inside the
user's windows (the bounds history uses), recalled messages left out, newest first
(``server_time``, then ``conv_id``, then ``seq``, all descending).

Two ways to read a conversation, because a word's rarity there decides which is cheap:
- **in time order** (``_RECENT``): its newest rows with tokens, through
  ``messages_search_time``, a budget of rows at a time, each tested against the query.
  Cheap where the query is common: a few rows per result.
- **through the GIN index** on ``(conv_id, search)`` (``_SPARSE``): the conversation's
  entries intersected with the query's tokens, every match read (up to ``DENSE_AT``).
  Cheap where the query is rare.

Every conversation is first read in time order for ``FIRST_BUDGET`` rows. A conversation
whose unread rows can no longer make the page (they are all older than the page's last
result) is done; so is one read to its end. The others are read through the GIN index;
where that finds ``DENSE_AT`` matches or more, the conversation goes back to time order
with a budget four times larger each round (never reading it more than about twice).
The page is exact: the true newest ``limit`` matches, whatever the mix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.protocol.types import MAX_INT64
from im_server.search_text import Part
from im_server.storage.conversations import MESSAGE_COLUMNS, message_dict

DENSE_AT = 64
"""Matches in one conversation from which it is read in time order instead."""
FIRST_BUDGET = 32
"""Rows of each conversation read in time order first."""
MAX_BUDGET = 16384


class Position(NamedTuple):
    """A place in the order of results: (server_time, conv_id, seq), descending."""

    server_time: int
    conv_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class _Window:
    conv_id: str
    lo: int
    hi: int


_WINDOWS = """
SELECT m.conv_id, GREATEST(c.min_seq, m.min_seq),
       LEAST(c.max_seq, COALESCE(m.max_seq, 9223372036854775807))
  FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id
 WHERE m.user_id = :u {one_conv}
"""

# the window is a range test, not ``seq BETWEEN``: as a bound of the primary key it made
# the planner read each conversation's whole window and test every row. Only the query's
# rarest part (``driver``) goes to the index; the whole query is tested on the rows found
# (``ts_match_vq`` is ``@@`` as a function, which the planner cannot hand to the index):
# the index collects a prefix's matches for the whole partition before it intersects
# them, once per conversation, so "b zzyzx" given whole cost 146 ms and seven one-letter
# words with an absent one 830 ms, at a million messages
_SPARSE = """
SELECT w.c, x.seq, x.server_time
  FROM unnest(CAST(:c AS text[]), CAST(:lo AS bigint[]), CAST(:hi AS bigint[]),
              CAST(:bt AS bigint[]), CAST(:bq AS bigint[])) AS w(c, lo, hi, bt, bq)
  CROSS JOIN LATERAL (
        SELECT x.seq, x.server_time FROM messages x
         WHERE x.conv_id = w.c AND x.search @@ CAST(:driver AS tsquery)
           AND ts_match_vq(x.search, CAST(:q AS tsquery))
           AND int8range(w.lo, w.hi, '[]') @> x.seq AND NOT x.recalled
           AND (x.server_time, x.seq) < (w.bt, w.bq)
         LIMIT :cap
       ) x
"""

# per conversation: the next ``budget`` rows with tokens below its bound and inside the
# window (tested on the index entries: rows outside it cost no table read), newest first;
# the matches among them, and the last row read (where the next round starts) when the
# budget was used up
_RECENT = """
SELECT w.c, y.seq, y.server_time, y.hit, y.rn
  FROM unnest(CAST(:c AS text[]), CAST(:lo AS bigint[]), CAST(:hi AS bigint[]),
              CAST(:bt AS bigint[]), CAST(:bq AS bigint[])) AS w(c, lo, hi, bt, bq)
  CROSS JOIN LATERAL (
        SELECT x.seq, x.server_time,
               x.search @@ CAST(:q AS tsquery) AND NOT x.recalled AS hit,
               row_number() OVER (ORDER BY x.server_time DESC, x.seq DESC) AS rn
          FROM (SELECT * FROM messages x
                 WHERE x.conv_id = w.c AND x.search IS NOT NULL
                   AND (x.server_time, x.seq) < (w.bt, w.bq)
                   AND x.seq BETWEEN w.lo AND w.hi
                 ORDER BY x.server_time DESC, x.seq DESC
                 LIMIT :budget) x
       ) y
 WHERE y.hit OR y.rn = :budget
"""

_ROWS = """
SELECT {columns} FROM unnest(CAST(:c AS text[]), CAST(:q AS bigint[])) AS k(c, q)
  JOIN messages x ON x.conv_id = k.c AND x.seq = k.q
"""
_COLUMNS = ", ".join("x." + c.strip() for c in MESSAGE_COLUMNS.split(","))

_START = Position(MAX_INT64, "", 0)


# the commonest tokens and their share of rows, from each partition's statistics
_STATS = """
SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs
  FROM pg_stats s JOIN pg_inherits i
    ON i.inhrelid = to_regclass(quote_ident(s.schemaname) || '.' || quote_ident(s.tablename))
 WHERE i.inhparent = 'messages'::regclass AND s.attname = 'search'
   AND s.most_common_elems IS NOT NULL
"""
STATS_SECONDS = 600.0
_stats: tuple[float, dict[str, float]] = (float("-inf"), {})


async def token_shares(conn: AsyncConnection) -> dict[str, float]:
    """{token: share of rows holding it} for the commonest tokens (PostgreSQL's
    statistics, averaged over the partitions), read again every ``STATS_SECONDS``."""
    global _stats
    now = time.monotonic()
    if now - _stats[0] < STATS_SECONDS:
        return _stats[1]
    sums: dict[str, float] = {}
    n = 0
    for elems, freqs in await conn.execute(text(_STATS)):
        n += 1
        for e, f in zip(elems, freqs, strict=False):
            sums[e] = sums.get(e, 0.0) + float(f)
    shares = {e: f / n for e, f in sums.items()} if n else {}
    _stats = (now, shares)
    return shares


def rarest(found: list[Part], shares: dict[str, float]) -> Part:
    """The part of a query the fewest rows hold, as far as the statistics tell: a prefix
    counts every common token it begins; a run, its rarest bigram. Ties (parts too rare
    to be in the statistics): the longest, then a whole run before a prefix."""

    def share(p: Part) -> float:
        if p.prefix:
            return sum(f for t, f in shares.items() if t.startswith(p.tokens[0]))
        return min(shares.get(t, 0.0) for t in p.tokens)

    return min(found, key=lambda p: (share(p), -sum(map(len, p.tokens)), p.prefix))


def _key(p: Position) -> tuple[int, str, int]:
    return (p.server_time, p.conv_id, p.seq)


def first_bound(conv_id: str, before: Position) -> tuple[int, int]:
    """Where a conversation's time-order reading starts, as (server_time, seq) strictly
    above every row it may return: the rows below ``before`` in the order of results."""
    if conv_id < before.conv_id:
        return before.server_time, MAX_INT64  # same time, any seq: still below
    if conv_id == before.conv_id:
        return before.server_time, before.seq
    return before.server_time, 0  # same time: above the cursor; only older times


def _page(found: list[Position], n: int) -> list[Position]:
    return sorted(found, key=_key, reverse=True)[:n]


async def windows(conn: AsyncConnection, user_id: int, conv_id: str | None) -> list[_Window]:
    params: dict[str, Any] = {"u": user_id}
    if conv_id is not None:
        params["c"] = conv_id
    sql = _WINDOWS.format(one_conv="AND m.conv_id = :c" if conv_id is not None else "")
    r = await conn.execute(text(sql), params)
    return [_Window(str(c), int(lo), int(hi)) for c, lo, hi in r if hi >= lo]


async def find(
    conn: AsyncConnection,
    user_id: int,
    found_parts: list[Part],
    limit: int,
    conv_id: str | None = None,
    before: Position | None = None,
) -> list[dict[str, Any]]:
    """:func:`search` for the parts of a query (``search_text.parts``), every part
    required, the rarest of them given to the GIN index."""
    driver = rarest(found_parts, await token_shares(conn))
    tsquery = " & ".join(p.fragment for p in found_parts)
    return await search(conn, user_id, tsquery, limit, conv_id, before, driver.fragment)


async def search(
    conn: AsyncConnection,
    user_id: int,
    tsquery: str,
    limit: int,
    conv_id: str | None = None,
    before: Position | None = None,
    driver: str | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` matching messages, newest first, strictly after ``before`` in that
    order. ``driver``: the part of ``tsquery`` the GIN index looks up (see
    :func:`rarest`); by default all of it."""
    b = before or _START
    wins = {w.conv_id: w for w in await windows(conn, user_id, conv_id)}
    if not wins:
        return []
    bounds = {c: first_bound(c, b) for c in sorted(wins)}
    found, bounds = await _recent_round(conn, tsquery, wins, bounds, FIRST_BUDGET, [], limit)
    if bounds:
        found, bounds = await _sparse_round(
            conn, tsquery, driver or tsquery, wins, bounds, found, limit
        )
    budget = FIRST_BUDGET * 4
    while bounds:
        found, bounds = await _recent_round(conn, tsquery, wins, bounds, budget, found, limit)
        budget = min(budget * 4, MAX_BUDGET)
    page = _page(found, limit)
    if not page:
        return []
    rows = await conn.execute(
        text(_ROWS.format(columns=_COLUMNS)),
        {"c": [p.conv_id for p in page], "q": [p.seq for p in page]},
    )
    by_key = {(m["conv_id"], m["seq"]): m for m in map(message_dict, rows)}
    return [by_key[(p.conv_id, p.seq)] for p in page if (p.conv_id, p.seq) in by_key]


def _still_open(
    bounds: dict[str, tuple[int, int]], found: list[Position], limit: int
) -> tuple[list[Position], dict[str, tuple[int, int]]]:
    """The page so far, and the conversations whose unread rows (all below their bound)
    could still make it: every one while the page is short, else those whose bound is
    above the page's last result."""
    page = _page(found, limit)
    if len(page) < limit:
        return page, bounds
    floor = _key(page[-1])
    return page, {c: tq for c, tq in bounds.items() if (tq[0], c, tq[1]) > floor}


def _arrays(wins: dict[str, _Window], bounds: dict[str, tuple[int, int]]) -> dict[str, list[Any]]:
    convs = sorted(bounds)
    return {
        "c": convs,
        "lo": [wins[c].lo for c in convs],
        "hi": [wins[c].hi for c in convs],
        "bt": [bounds[c][0] for c in convs],
        "bq": [bounds[c][1] for c in convs],
    }


async def _sparse_round(
    conn: AsyncConnection,
    tsquery: str,
    driver: str,
    wins: dict[str, _Window],
    bounds: dict[str, tuple[int, int]],
    found: list[Position],
    limit: int,
) -> tuple[list[Position], dict[str, tuple[int, int]]]:
    """The open conversations through the GIN index: where fewer than ``DENSE_AT``
    matches lie below the bound, they are all of them (the conversation is done); the
    others stay open, from the same bound, for time order."""
    r = await conn.execute(
        text(_SPARSE),
        {**_arrays(wins, bounds), "q": tsquery, "driver": driver, "cap": DENSE_AT},
    )
    per_conv: dict[str, list[Position]] = {}
    for c, q, t in r:
        per_conv.setdefault(str(c), []).append(Position(int(t), str(c), int(q)))
    found = found + [p for ps in per_conv.values() if len(ps) < DENSE_AT for p in ps]
    dense = {c: tq for c, tq in bounds.items() if len(per_conv.get(c, ())) >= DENSE_AT}
    return _still_open(dense, found, limit)


async def _recent_round(
    conn: AsyncConnection,
    tsquery: str,
    wins: dict[str, _Window],
    bounds: dict[str, tuple[int, int]],
    budget: int,
    found: list[Position],
    limit: int,
) -> tuple[list[Position], dict[str, tuple[int, int]]]:
    """One time-order round over the open conversations: their matches join ``found``;
    a conversation stays open while it has unread rows that could still make the page."""
    r = await conn.execute(text(_RECENT), {**_arrays(wins, bounds), "q": tsquery, "budget": budget})
    found = list(found)
    nxt: dict[str, tuple[int, int]] = {}
    for c, q, t, hit, rn in r:
        if hit:
            found.append(Position(int(t), str(c), int(q)))
        if int(rn) == budget:
            nxt[str(c)] = (int(t), int(q))  # more rows below this one
    return _still_open(nxt, found, limit)
