"""The conversation-state query: every conversation of a user with its window, cursors,
settings, last message and unread and mention counts, from one statement (the
COALESCE fallback of the unread rule included), and the badge of many users."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.conversations import MESSAGE_COLUMNS, ROLE_NAMES, SINGLE, message_dict

_WIN_MIN = "GREATEST(c.min_seq, m.min_seq)"
_WIN_MAX = "LEAST(c.max_seq, COALESCE(m.max_seq, c.max_seq))"
_CURSOR = (
    "COALESCE(m.read_seq, (SELECT max(s.seq) FROM messages s WHERE s.conv_id = m.conv_id "
    "AND s.sender_id = m.user_id), 0)"
)
# the content types that never count as unread: the notices and system messages
NOT_COUNTED = ("recall", "system", "edit", "reaction")
# seqs per row of message_blocks (migration 0021, whose triggers keep the rows)
BLOCK = 64
_NO_END = 9223372036854775807
# My unread messages in a conversation are the countable ones (not a notice, not mine)
# in (lo, hi]: after my cursor and my window's start, up to my window's end.
_LO = f"GREATEST({_CURSOR}, {_WIN_MIN} - 1)"
_HI = f"COALESCE(m.max_seq, {_NO_END})"
_COUNTABLE = f"x.content_type NOT IN {NOT_COUNTED!r}"
# Counted without visiting each unread message: message_blocks holds the countable (and
# mentioning) messages per conversation and block of BLOCK seqs. With C(s) the countable
# messages up to seq s, and b(s) = s / B, either
#   C(s) = sum of blocks < b(s) + countable in [b(s)*B, s]             (down from s)
#   C(s) = sum of blocks <= b(s) - countable in (s, (b(s)+1)*B)        (up from s)
# and countable in (lo, hi] = C(hi) - C(lo): a sum of blocks and at most two edges of
# less than a block. lo's edge is taken on the side nearer lo (half a block at most,
# ``_UP``) while the window is open; hi's edge only when the window has an end (else hi
# is past every seq). My own countable messages in (lo, hi] come off that (an
# index-only count on messages_sender, which includes content_type). The parts that are
# 0 without looking are not looked at: the end edge while the window is open, my own
# messages while I have no read cursor (lo is then at or after my last message), the
# mention count where the blocks from lo's on hold no mention. ``w`` is computed once
# (OFFSET 0 keeps the planner from copying the cursor fallback into each use).
_UP = f"(m.max_seq IS NULL AND w.lo % {BLOCK} >= {BLOCK // 2})"
_EDGE_DOWN = (
    f"(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id "
    f"AND x.seq >= w.{{b}} / {BLOCK} * {BLOCK} AND x.seq <= w.{{b}} AND {_COUNTABLE})"
)
_EDGE_UP = (
    f"(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id "
    f"AND x.seq > w.lo AND x.seq < (w.lo / {BLOCK} + 1) * {BLOCK} AND {_COUNTABLE})"
)
_MINE = (
    "(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id AND x.sender_id = m.user_id "
    f"AND x.seq > w.lo AND x.seq <= w.hi AND {_COUNTABLE})"
)
# The mention count: the partial index messages_mentions (only messages that mention
# anyone, covering what this reads), so it stays an index-only scan however long the
# backlog is.
_MENTIONS = (
    "(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id "
    f"AND x.seq > w.lo AND x.seq <= w.hi AND x.sender_id <> m.user_id AND {_COUNTABLE} "
    "AND (x.mention_all OR cardinality(x.mentions) > 0) "
    "AND (x.mention_all OR m.user_id = ANY(x.mentions)))"
)
# ``k.unread`` and ``k.mention_unread`` of the member row ``m`` of conversation ``c``.
COUNTS_JOIN = f"""
    LEFT JOIN LATERAL (
        SELECT bs.countable
               + CASE WHEN {_UP} THEN {_EDGE_UP} ELSE -{_EDGE_DOWN.format(b="lo")} END
               + CASE WHEN m.max_seq IS NULL THEN 0 ELSE {_EDGE_DOWN.format(b="hi")} END
               - CASE WHEN m.read_seq IS NULL THEN 0 ELSE {_MINE} END AS unread,
               CASE WHEN bs.mentioning = 0 THEN 0 ELSE {_MENTIONS} END AS mention_unread
          FROM (SELECT {_LO} AS lo, {_HI} AS hi OFFSET 0) w,
               LATERAL (
                 SELECT COALESCE(sum(b.countable) FILTER (
                            WHERE b.blk < w.hi / {BLOCK}
                              AND (b.blk > w.lo / {BLOCK} OR NOT {_UP})), 0) AS countable,
                        COALESCE(sum(b.mentioning), 0) AS mentioning
                   FROM message_blocks b
                  WHERE b.conv_id = m.conv_id AND b.blk >= w.lo / {BLOCK}
                    AND b.blk <= w.hi / {BLOCK}) bs
         WHERE w.hi > w.lo) k ON true"""
_UNREAD = "COALESCE(k.unread, 0)"
_MENTION_UNREAD = "COALESCE(k.mention_unread, 0)"


# A state's sync version: my own row's (and its settings'), the conversation's while I
# am in it (new messages), and in a single chat the peer's row (its cursors, not its
# settings: those are the peer's business), joined as ``pm`` by PEER_JOIN (shared with
# the sync query).
STATE_VERSION = "GREATEST(m.version, m.settings_version, CASE WHEN m.max_seq IS NULL THEN c.version ELSE 0 END, COALESCE(pm.version, 0))"
PEER_JOIN = "LEFT JOIN conv_members pm ON c.conv_type = 1 AND pm.conv_id = m.conv_id AND pm.user_id <> m.user_id"


async def states(
    conn: AsyncConnection,
    user_id: int,
    *,
    conv_ids: list[str] | None = None,
    include_hidden: bool = False,
) -> list[dict[str, Any]]:
    """Conversation states of a user, each with its unread count and last visible message."""
    where = "m.user_id = :u"
    params: dict[str, Any] = {"u": user_id}
    if conv_ids is not None:
        where += " AND m.conv_id = ANY(:cids)"
        params["cids"] = conv_ids
    if not include_hidden:
        where += " AND (m.hidden_seq IS NULL OR c.max_seq > m.hidden_seq)"
    sql = f"""
        SELECT c.conv_id, c.conv_type, c.group_id, g.name,
               {_WIN_MIN} AS wmin, {_WIN_MAX} AS wmax, m.read_seq,
               {STATE_VERSION} AS version,
               pm.user_id, pm.read_seq, pm.delivered_seq, {_UNREAD} AS unread,
               lm.conv_id, lm.seq, lm.sender_id, lm.client_msg_id, lm.content_type, lm.content,
               lm.server_time, lm.recalled, m.max_seq IS NULL AS active, m.role,
               (m.hidden_seq IS NOT NULL AND c.max_seq <= m.hidden_seq) AS hidden,
               lm.mentions, lm.mention_all, lm.reply_to, {_MENTION_UNREAD} AS mention_unread,
               lm.edited_at, m.muted, m.pinned
        FROM conv_members m
        JOIN conversations c ON c.conv_id = m.conv_id
        LEFT JOIN groups g ON g.group_id = c.group_id
        {PEER_JOIN}
        {COUNTS_JOIN}
        LEFT JOIN LATERAL (
            SELECT {MESSAGE_COLUMNS} FROM messages x
            WHERE x.conv_id = m.conv_id AND x.seq >= {_WIN_MIN}
              AND x.seq <= COALESCE(m.max_seq, 9223372036854775807)
            ORDER BY x.seq DESC LIMIT 1) lm ON true
        WHERE {where}
        ORDER BY m.pinned DESC, COALESCE(lm.server_time, 0) DESC, c.conv_id
    """
    out = []
    for r in await conn.execute(text(sql), params):
        wmin, wmax = int(r[4]), int(r[5])
        st: dict[str, Any] = {
            "conv_id": r[0],
            "type": "single" if r[1] == SINGLE else "group",
            "min_seq": wmin,
            "max_seq": max(wmax, wmin - 1),
            "read_seq": int(r[6] or 0),
            "unread": int(r[11]),
            "mention_unread": int(r[26]),
            "last_message": (
                message_dict((*r[12:20], *r[23:26], r[27])) if r[12] is not None else None
            ),
            "version": int(r[7]),
            "muted": bool(r[28]),
            "pinned": bool(r[29]),
        }
        if include_hidden:
            st["hidden"] = bool(r[22])
        if r[1] == SINGLE:
            st["peer_id"] = int(r[8]) if r[8] is not None else None
            st["peer_read_seq"] = int(r[9] or 0)
            st["peer_delivered_seq"] = int(r[10] or 0)
        else:
            st["group_id"] = int(r[2])
            st["name"] = r[3]
            st["active"] = bool(r[20])
            st["role"] = ROLE_NAMES.get(int(r[21]), "member")
        out.append(st)
    return out


@dataclass(slots=True)
class UnreadCounts:
    """Every conversation with unread messages, (conv_id, unread, mention_unread) by
    conv_id, and the badge: unread over the conversations I did not mute, plus
    mention_unread over the ones I muted (a mention breaks through a mute)."""

    rows: list[tuple[str, int, int]]
    badge: int


# The badge is a window sum over the same rows, so counts and badge come from one
# statement and one snapshot: no second query, no counter kept beside the messages.
# Conversations without unread messages add nothing (mention_unread <= unread), so the
# filter on unread > 0 can come before the sum. The counts are a MATERIALIZED CTE: inlined,
# the planner would copy each count subquery into the filter, the output and the sum, and
# run it up to three times per conversation.
_UNREAD_COUNTS = f"""
    WITH t AS MATERIALIZED (
        SELECT m.conv_id, m.muted, {_UNREAD} AS unread, {_MENTION_UNREAD} AS mention_unread
          FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id
          {COUNTS_JOIN}
         WHERE m.user_id = :u)
    SELECT conv_id, unread, mention_unread,
           sum(CASE WHEN muted THEN mention_unread ELSE unread END) OVER ()
      FROM t
     WHERE unread > 0
     ORDER BY conv_id
"""


async def unread(conn: AsyncConnection, user_id: int) -> UnreadCounts:
    """The unread counts of every conversation of the user, and the badge, in one
    statement."""
    rows = list(await conn.execute(text(_UNREAD_COUNTS), {"u": user_id}))
    return UnreadCounts(
        rows=[(str(a), int(b), int(n)) for a, b, n, _ in rows],
        badge=int(rows[0][3]) if rows else 0,
    )


# The badges of many users at once (the pusher's), from the same fragments as the
# statement above: the same count, the same mute rule, so a push's badge is the one
# GET /v1/unread answers.
_BADGES = f"""
    WITH t AS MATERIALIZED (
        SELECT m.user_id, m.muted, {_UNREAD} AS unread, {_MENTION_UNREAD} AS mention_unread
          FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id
          {COUNTS_JOIN}
         WHERE m.user_id = ANY(CAST(:us AS bigint[])))
    SELECT user_id, sum(CASE WHEN muted THEN mention_unread ELSE unread END)
      FROM t GROUP BY user_id
"""

# The read cursor the unread count starts from, for statements elsewhere that must follow
# the same rule (the pusher's recipients); ``m`` is the conv_members row.
CURSOR = _CURSOR


async def badges(conn: AsyncConnection, user_ids: list[int]) -> dict[int, int]:
    """Each user's badge (as in :func:`unread`), one statement for all of them."""
    if not user_ids:
        return {}
    r = await conn.execute(text(_BADGES), {"us": user_ids})
    out = dict.fromkeys(user_ids, 0)
    out.update({int(u): int(b) for u, b in r})
    return out


async def unread_counts(conn: AsyncConnection, user_id: int) -> list[tuple[str, int, int]]:
    """(conv_id, unread, mention_unread) of every conversation of the user with unread
    messages, in one statement."""
    return (await unread(conn, user_id)).rows
