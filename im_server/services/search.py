"""Search over the messages I can see: my windows as history applies them, recalled
messages left out, edited content current (see im_server/search_text.py for what
matches). Pages run newest first; the cursor is opaque to clients."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from im_server.context import Context
from im_server.errors import bad_request
from im_server.protocol.types import MAX_INT64, ConvRef, conv_ref
from im_server.search_text import MAX_QUERY_CHARS, Part, parts
from im_server.services.history import load_member
from im_server.storage import reactions
from im_server.storage import search as store
from im_server.storage.search import Position


def encode_cursor(p: Position) -> str:
    raw = f"{p.server_time}:{p.seq}:{p.conv_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    """The position a ``next_before`` names; anything else is a ``bad_request``."""
    bad = bad_request("before must be a next_before from an earlier search")
    if len(cursor) > 128:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        t, q, c = raw.split(":", 2)
        p = Position(int(t), conv_ref(c).conv_id, int(q))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if not (0 <= p.server_time <= MAX_INT64 and 1 <= p.seq <= MAX_INT64):
        raise bad
    if encode_cursor(p) != cursor.rstrip("="):
        raise bad  # one spelling per position (no leading zeros, signs or spaces)
    return p


def check_query(q: str | None) -> list[Part]:
    """The parts of ``q`` (none: nothing searchable in it); a missing, blank or too long
    ``q`` is a ``bad_request``."""
    if q is None or not q.strip():
        raise bad_request("q must be a non-blank search text")
    if len(q) > MAX_QUERY_CHARS:
        raise bad_request(f"q must be at most {MAX_QUERY_CHARS} characters")
    return parts(q)


async def search(
    ctx: Context,
    user_id: int,
    q: str | None,
    ref: ConvRef | None,
    limit: int,
    before: str | None,
) -> dict[str, Any]:
    found_parts = check_query(q)
    position = decode_cursor(before) if before is not None else None
    await ctx.rate.search.hold(user_id, "searches")  # bad input is refused before it counts
    async with ctx.db.connect() as raw:
        # one snapshot: a page is read in a few statements (windows, time order, the GIN
        # index, the rows), and a recall or an edit between two of them must not show
        conn = await raw.execution_options(isolation_level="REPEATABLE READ")
        await conn.begin()
        if ref is not None:
            await load_member(conn, ref, user_id)  # not mine: the same answer as history
        if not found_parts:
            return {"results": [], "next_before": None}
        found = await store.find(
            conn,
            user_id,
            found_parts,
            limit + 1,
            conv_id=ref.conv_id if ref is not None else None,
            before=position,
        )
        page = found[:limit]
        await reactions.attach(conn, user_id, page)
    nxt = None
    if len(found) > limit:
        last = page[-1]
        nxt = encode_cursor(Position(last["server_time"], last["conv_id"], last["seq"]))
    return {"results": page, "next_before": nxt}
