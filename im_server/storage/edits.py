"""Edits: the newest content of an edited message, applied by the seq of its edit notice
(``edit_seq``): a notice older than the one applied changes nothing, so the request and
the persister may both apply the same edit, in any order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.search_text import message_document


@dataclass(frozen=True, slots=True)
class Edit:
    conv_id: str
    seq: int
    """the edited message"""
    content_json: str
    edit_seq: int
    """the edit notice's seq"""
    edited_at: int
    """the edit notice's server time"""


_APPLY = (
    "UPDATE messages m SET content = CAST(x.b AS jsonb), edited_at = x.ts, edit_seq = x.es, "
    "search = CAST(x.d AS tsvector) "
    "FROM unnest({c}, {q}, {b}, {ts}, {es}, {d}) AS x(c, q, b, ts, es, d) "
    "WHERE m.conv_id = x.c AND m.seq = x.q AND NOT m.recalled "
    "AND (m.edit_seq IS NULL OR m.edit_seq < x.es)"
)
_APPLY_SA = _APPLY.format(
    c="CAST(:c AS text[])",
    q="CAST(:q AS bigint[])",
    b="CAST(:b AS text[])",
    ts="CAST(:ts AS bigint[])",
    es="CAST(:es AS bigint[])",
    d="CAST(:d AS text[])",
)
_APPLY_PG = _APPLY.format(
    c="$1::text[]",
    q="$2::bigint[]",
    b="$3::text[]",
    ts="$4::bigint[]",
    es="$5::bigint[]",
    d="$6::text[]",
)


def newest(edits: Iterable[Edit]) -> list[Edit]:
    """One edit per message, the one with the highest notice seq, in (conv, seq) order
    (a fixed lock order across writers)."""
    best: dict[tuple[str, int], Edit] = {}
    for e in edits:
        k = (e.conv_id, e.seq)
        if k not in best or best[k].edit_seq < e.edit_seq:
            best[k] = e
    return [best[k] for k in sorted(best)]


def _columns(
    edits: list[Edit],
) -> tuple[list[str], list[int], list[str], list[int], list[int], list[str | None]]:
    """The statement's arrays; the last one: the new content's search tokens."""
    return (
        [e.conv_id for e in edits],
        [e.seq for e in edits],
        [e.content_json for e in edits],
        [e.edited_at for e in edits],
        [e.edit_seq for e in edits],
        [message_document(e.content_json) for e in edits],
    )


async def apply(conn: AsyncConnection, edits: Iterable[Edit]) -> None:
    todo = newest(edits)
    if todo:
        c, q, b, ts, es, d = _columns(todo)
        await conn.execute(text(_APPLY_SA), {"c": c, "q": q, "b": b, "ts": ts, "es": es, "d": d})


async def apply_pg(conn: asyncpg.Connection, edits: Iterable[Edit]) -> None:
    """:func:`apply` on a plain asyncpg connection (the persister's)."""
    todo = newest(edits)
    if todo:
        await conn.execute(_APPLY_PG, *_columns(todo))


async def current(
    conn: AsyncConnection, conv_id: str, seq: int
) -> tuple[Any, int | None, int | None] | None:
    """(content, edit_seq, edited_at) of the message, read together (one snapshot: an
    edit applied between two reads would pair a content with another edit's seq)."""
    row = (
        await conn.execute(
            text(
                "SELECT content, edit_seq, edited_at FROM messages WHERE conv_id = :c AND seq = :q"
            ),
            {"c": conv_id, "q": seq},
        )
    ).first()
    if row is None:
        return None
    content = orjson.loads(row[0]) if isinstance(row[0], str) else row[0]
    return content, row[1], row[2]
