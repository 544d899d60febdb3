"""Search: the messages of a user's conversations whose tokens match a query, inside the
user's windows (the bounds history uses), recalled messages left out, newest first."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.conversations import MESSAGE_COLUMNS, message_dict


class Position(NamedTuple):
    """Where a page ends in the order of results: (server_time, conv_id, seq), descending."""

    server_time: int
    conv_id: str
    seq: int


# One statement: my windows (conversation bounds and mine, as history clamps them), then,
# per conversation, a scan of the GIN index on (conv_id, search) that intersects that
# conversation's entries with the query's tokens (so a word common elsewhere costs
# nothing here), the rows clamped to the window and past the page's start, newest first.
_SEARCH = """
WITH w AS MATERIALIZED (
    SELECT m.conv_id, GREATEST(c.min_seq, m.min_seq) AS lo,
           LEAST(c.max_seq, COALESCE(m.max_seq, 9223372036854775807)) AS hi
      FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id
     WHERE m.user_id = :u {one_conv}
)
SELECT {columns}
  FROM w CROSS JOIN LATERAL (
        SELECT * FROM messages x
         WHERE x.conv_id = w.conv_id AND x.search @@ CAST(:q AS tsquery)
           AND x.seq BETWEEN w.lo AND w.hi AND NOT x.recalled
           AND (x.server_time, x.conv_id, x.seq) < (:bt, :bc, :bq)
       ) x
 ORDER BY x.server_time DESC, x.conv_id DESC, x.seq DESC
 LIMIT :n
"""
_COLUMNS = ", ".join("x." + c.strip() for c in MESSAGE_COLUMNS.split(","))
_ALL = _SEARCH.format(one_conv="", columns=_COLUMNS)
_ONE = _SEARCH.format(one_conv="AND m.conv_id = :c", columns=_COLUMNS)
_START = Position(9223372036854775807, "", 0)


async def search(
    conn: AsyncConnection,
    user_id: int,
    tsquery: str,
    limit: int,
    conv_id: str | None = None,
    before: Position | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` matching messages, newest first, strictly before ``before``."""
    b = before or _START
    params: dict[str, Any] = {
        "u": user_id,
        "q": tsquery,
        "bt": b.server_time,
        "bc": b.conv_id,
        "bq": b.seq,
        "n": limit,
    }
    if conv_id is not None:
        params["c"] = conv_id
    r = await conn.execute(text(_ONE if conv_id is not None else _ALL), params)
    return [message_dict(row) for row in r]
