"""Conversations, members and their windows, and the conversation-state query (with
the unread count of each, from one statement)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms

SINGLE, GROUP = 1, 2
ROLE_MEMBER, ROLE_ADMIN, ROLE_OWNER = 0, 1, 2
ROLE_NAMES = {ROLE_MEMBER: "member", ROLE_ADMIN: "admin", ROLE_OWNER: "owner"}
NOT_UNREAD_TYPES = ("recall", "system", "edit", "reaction")


@dataclass(slots=True)
class ConvRow:
    conv_id: str
    conv_type: int
    group_id: int | None
    min_seq: int
    max_seq: int


@dataclass(slots=True)
class MemberRow:
    conv_id: str
    user_id: int
    role: int
    min_seq: int
    max_seq: int | None
    read_seq: int | None
    delivered_seq: int
    hidden_seq: int | None

    @property
    def active(self) -> bool:
        return self.max_seq is None


async def conv_row(conn: AsyncConnection, conv_id: str) -> ConvRow | None:
    row = (
        await conn.execute(
            text(
                "SELECT conv_id, conv_type, group_id, min_seq, max_seq FROM conversations WHERE conv_id = :c"
            ),
            {"c": conv_id},
        )
    ).first()
    return ConvRow(*row) if row else None


async def conv_and_member(
    conn: AsyncConnection, conv_id: str, user_id: int
) -> tuple[ConvRow | None, MemberRow | None]:
    """The conversation and the user's row in it, in one round trip."""
    row = (
        await conn.execute(
            text(
                "SELECT c.conv_id, c.conv_type, c.group_id, c.min_seq, c.max_seq, m.conv_id, "
                "m.user_id, m.role, m.min_seq, m.max_seq, m.read_seq, m.delivered_seq, "
                "m.hidden_seq FROM conversations c LEFT JOIN conv_members m "
                "ON m.conv_id = c.conv_id AND m.user_id = :u WHERE c.conv_id = :c"
            ),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    if row is None:
        return None, None
    return ConvRow(*row[:5]), MemberRow(*row[5:]) if row[5] is not None else None


async def ensure_conversation(
    conn: AsyncConnection, conv_id: str, conv_type: int, group_id: int | None = None
) -> None:
    await conn.execute(
        text(
            "INSERT INTO conversations (conv_id, conv_type, group_id, created_at) VALUES (:c, :t, :g, :n) "
            "ON CONFLICT DO NOTHING"
        ),
        {"c": conv_id, "t": conv_type, "g": group_id, "n": now_ms()},
    )


async def ensure_single_members(
    conn: AsyncConnection, conv_id: str, a: int, b: int, version: int
) -> None:
    """Both sides of a single chat; existing rows keep their window (a clear point survives
    removing and adding back) and become visible again."""
    await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, version, joined_at) VALUES (:c, :a, :v, :n), "
            "(:c, :b, :v, :n) ON CONFLICT (conv_id, user_id) DO UPDATE SET hidden_seq = NULL, version = :v"
        ),
        {"c": conv_id, "a": a, "b": b, "v": version, "n": now_ms()},
    )


async def upsert_members(
    conn: AsyncConnection,
    conv_id: str,
    user_ids: list[int],
    role: int,
    min_seq: int,
    read_seq: int | None,
    version: int,
) -> None:
    """Join or re-join many at once: each window is replaced (open end, new start)."""
    await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, "
            "hidden_seq, version, joined_at) SELECT :c, u, :r, :mn, NULL, CAST(:rs AS bigint), COALESCE(CAST(:rs AS bigint), 0), "
            "NULL, :v, :n FROM unnest(CAST(:us AS bigint[])) AS x(u) "
            "ON CONFLICT (conv_id, user_id) DO UPDATE SET role = EXCLUDED.role, min_seq = EXCLUDED.min_seq, "
            "max_seq = NULL, read_seq = EXCLUDED.read_seq, "
            "delivered_seq = GREATEST(conv_members.delivered_seq, EXCLUDED.delivered_seq), "
            "hidden_seq = NULL, version = EXCLUDED.version, joined_at = EXCLUDED.joined_at"
        ),
        {
            "c": conv_id,
            "us": user_ids,
            "r": role,
            "mn": min_seq,
            "rs": read_seq,
            "v": version,
            "n": now_ms(),
        },
    )


async def insert_new_members(
    conn: AsyncConnection, conv_id: str, user_ids: list[int], min_seq: int
) -> list[int]:
    """Add those of ``user_ids`` who were never members (one statement, any number): a
    window from ``min_seq``, no read cursor, version 0 (their state's version is the
    conversation's: :func:`stamp`). Rows that exist are left alone. Ascending ids of the
    rows made. Takes no lock that a writer holding the sync version waits for (new rows
    are invisible until the commit), so it runs before that lock is taken."""
    rows = await conn.execute(
        text(
            "INSERT INTO conv_members (conv_id, user_id, role, min_seq, max_seq, read_seq, "
            "delivered_seq, hidden_seq, version, joined_at) "
            "SELECT :c, u, 0, :mn, NULL, NULL, 0, NULL, 0, :n "
            "FROM unnest(CAST(:us AS bigint[])) AS x(u) "
            "ON CONFLICT (conv_id, user_id) DO NOTHING RETURNING user_id"
        ),
        {"c": conv_id, "us": user_ids, "mn": min_seq, "n": now_ms()},
    )
    return sorted(int(u) for u in rows.scalars())


async def rejoin_members(
    conn: AsyncConnection, conv_id: str, user_ids: list[int], end: int, version: int
) -> list[int]:
    """Former members among ``user_ids`` (their window closed) join again: the window is
    replaced, starting after ``end``, cursors at ``end``. Ascending ids of those rejoined.
    Existing rows: under the sync-version lock, like every update of a member row."""
    rows = await conn.execute(
        text(
            "UPDATE conv_members SET role = 0, min_seq = :e + 1, max_seq = NULL, read_seq = :e, "
            "delivered_seq = GREATEST(delivered_seq, :e), hidden_seq = NULL, version = :v, "
            "joined_at = :n "
            "WHERE conv_id = :c AND user_id = ANY(CAST(:us AS bigint[])) AND max_seq IS NOT NULL "
            "RETURNING user_id"
        ),
        {"c": conv_id, "us": user_ids, "e": end, "v": version, "n": now_ms()},
    )
    return sorted(int(u) for u in rows.scalars())


async def stamp(conn: AsyncConnection, conv_id: str, version: int) -> None:
    """Give the conversation the sync version ``version``: the state of every active
    member (new ones included) changed with it. One row, under the sync-version lock."""
    await conn.execute(
        text("UPDATE conversations SET version = GREATEST(version, :v) WHERE conv_id = :c"),
        {"c": conv_id, "v": version},
    )


async def not_active_among(conn: AsyncConnection, conv_id: str, user_ids: list[int]) -> list[int]:
    """Which of ``user_ids`` are not active members, ascending (one statement, any number
    of ids; a call naming only members returns no rows)."""
    r = await conn.execute(
        text(
            "SELECT u FROM unnest(CAST(:us AS bigint[])) AS x(u) WHERE NOT EXISTS ("
            "SELECT 1 FROM conv_members m WHERE m.conv_id = :c AND m.user_id = x.u "
            "AND m.max_seq IS NULL) ORDER BY u"
        ),
        {"c": conv_id, "us": user_ids},
    )
    return [int(x) for x in r.scalars()]


async def member(conn: AsyncConnection, conv_id: str, user_id: int) -> MemberRow | None:
    row = (
        await conn.execute(
            text(
                "SELECT conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, hidden_seq "
                "FROM conv_members WHERE conv_id = :c AND user_id = :u"
            ),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    return MemberRow(*row) if row else None


async def members(
    conn: AsyncConnection, conv_id: str, *, active_only: bool = True
) -> list[MemberRow]:
    sql = (
        "SELECT conv_id, user_id, role, min_seq, max_seq, read_seq, delivered_seq, hidden_seq "
        "FROM conv_members WHERE conv_id = :c"
    )
    if active_only:
        sql += " AND max_seq IS NULL"
    rows = await conn.execute(text(sql + " ORDER BY user_id"), {"c": conv_id})
    return [MemberRow(*r) for r in rows]


async def active_groups_of(conn: AsyncConnection, user_id: int) -> list[int]:
    """The groups the user is an active member of, ascending."""
    r = await conn.execute(
        text(
            "SELECT c.group_id FROM conv_members m JOIN conversations c ON c.conv_id = m.conv_id "
            "WHERE m.user_id = :u AND m.max_seq IS NULL AND c.conv_type = :g "
            "ORDER BY c.group_id"
        ),
        {"u": user_id, "g": GROUP},
    )
    return [int(x) for x in r.scalars()]


async def active_member_ids(conn: AsyncConnection, conv_id: str) -> list[int]:
    r = await conn.execute(
        text(
            "SELECT user_id FROM conv_members WHERE conv_id = :c AND max_seq IS NULL ORDER BY user_id"
        ),
        {"c": conv_id},
    )
    return [int(x) for x in r.scalars()]


async def active_member_mutes(conn: AsyncConnection, conv_id: str) -> list[tuple[int, int | None]]:
    """Each active member of a group and the end of its mute (ms; None: not muted)."""
    r = await conn.execute(
        text(
            "SELECT user_id, muted_until FROM conv_members WHERE conv_id = :c AND max_seq IS NULL "
            "ORDER BY user_id"
        ),
        {"c": conv_id},
    )
    return [(int(u), None if m is None else int(m)) for u, m in r.all()]


async def set_muted_until(
    conn: AsyncConnection, conv_id: str, user_id: int, until: int | None, version: int
) -> None:
    await conn.execute(
        text(
            "UPDATE conv_members SET muted_until = :m, version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "m": until, "v": version},
    )


async def active_members_of(conn: AsyncConnection, conv_ids: list[str]) -> list[int]:
    r = await conn.execute(
        text(
            "SELECT DISTINCT user_id FROM conv_members WHERE conv_id = ANY(:c) AND max_seq IS NULL"
        ),
        {"c": conv_ids},
    )
    return [int(x) for x in r.scalars()]


async def close_window(
    conn: AsyncConnection, conv_id: str, user_id: int, max_seq: int, version: int
) -> bool:
    r = await conn.execute(
        text(
            "UPDATE conv_members SET max_seq = :m, role = 0, version = :v "
            "WHERE conv_id = :c AND user_id = :u AND max_seq IS NULL"
        ),
        {"c": conv_id, "u": user_id, "m": max_seq, "v": version},
    )
    return (r.rowcount or 0) > 0


async def set_role(
    conn: AsyncConnection, conv_id: str, user_id: int, role: int, version: int
) -> None:
    await conn.execute(
        text("UPDATE conv_members SET role = :r, version = :v WHERE conv_id = :c AND user_id = :u"),
        {"c": conv_id, "u": user_id, "r": role, "v": version},
    )


async def raise_min_seq(
    conn: AsyncConnection, conv_id: str, user_id: int, min_seq: int, version: int
) -> None:
    """Clear my side: the window starts at min_seq (never moves back)."""
    await conn.execute(
        text(
            "UPDATE conv_members SET min_seq = GREATEST(min_seq, :m), version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "m": min_seq, "v": version},
    )


async def hide(conn: AsyncConnection, conv_id: str, user_id: int, upto: int, version: int) -> None:
    await conn.execute(
        text(
            "UPDATE conv_members SET hidden_seq = GREATEST(COALESCE(hidden_seq, 0), :h), version = :v "
            "WHERE conv_id = :c AND user_id = :u"
        ),
        {"c": conv_id, "u": user_id, "h": upto, "v": version},
    )


async def settings(conn: AsyncConnection, conv_id: str, user_id: int) -> tuple[bool, bool] | None:
    """(muted, pinned) of my member row, or None without one."""
    row = (
        await conn.execute(
            text("SELECT muted, pinned FROM conv_members WHERE conv_id = :c AND user_id = :u"),
            {"c": conv_id, "u": user_id},
        )
    ).first()
    return (bool(row[0]), bool(row[1])) if row else None


async def set_settings(
    conn: AsyncConnection,
    conv_id: str,
    user_id: int,
    muted: bool | None,
    pinned: bool | None,
    version: int,
) -> tuple[bool, bool]:
    """Set the given settings (None keeps the value) and their sync version (my state's
    only: see STATE_VERSION); returns (muted, pinned) after the write."""
    row = (
        await conn.execute(
            text(
                "UPDATE conv_members SET muted = COALESCE(CAST(:m AS boolean), muted), "
                "pinned = COALESCE(CAST(:p AS boolean), pinned), settings_version = :v "
                "WHERE conv_id = :c AND user_id = :u RETURNING muted, pinned"
            ),
            {"c": conv_id, "u": user_id, "m": muted, "p": pinned, "v": version},
        )
    ).one()
    return bool(row[0]), bool(row[1])


async def reserve_seq_block(
    conn: AsyncConnection, conv_id: str, conv_type: int, size: int
) -> tuple[int, int]:
    """Move the conversation's reserved high-water mark up by ``size``; returns (old, new).
    Seqs in (old, new] now belong to Redis, and no Redis will ever get them again."""
    r = await conn.execute(
        text(
            "INSERT INTO conversations (conv_id, conv_type, seq_reserved, created_at) VALUES (:c, :t, :s, :n) "
            "ON CONFLICT (conv_id) DO UPDATE SET seq_reserved = GREATEST(conversations.seq_reserved, "
            "conversations.max_seq) + :s RETURNING seq_reserved"
        ),
        {"c": conv_id, "t": conv_type, "s": size, "n": now_ms()},
    )
    new = int(r.scalar_one())
    return new - size, new


async def allocated_end(conn: AsyncConnection, conv_id: str) -> int:
    """Highest persisted seq (used when Redis cannot say what it handed out)."""
    r = await conn.execute(
        text("SELECT max_seq FROM conversations WHERE conv_id = :c"), {"c": conv_id}
    )
    v = r.scalar_one_or_none()
    return int(v or 0)


# The columns of a message row, in the order ``message_dict`` reads them (shared with the
# history and sync queries).
MESSAGE_COLUMNS = (
    "conv_id, seq, sender_id, client_msg_id, content_type, content, server_time, recalled, "
    "mentions, mention_all, reply_to, edited_at"
)


def message_dict(row: Any) -> dict[str, Any]:
    content = row[5]
    if isinstance(content, str):
        content = orjson.loads(content)
    return {
        "conv_id": row[0],
        "seq": int(row[1]),
        "sender_id": int(row[2]),
        "client_msg_id": row[3],
        "content_type": row[4],
        "content": content,
        "server_time": int(row[6]),
        "recalled": bool(row[7]),
        "mentions": [int(u) for u in row[8]],
        "mention_all": bool(row[9]),
        "reply_to": int(row[10]) if row[10] is not None else None,
        "edited_at": int(row[11]) if row[11] is not None else None,
        "reactions": [],  # filled for the reader by storage.reactions.attach
    }


# The visible window of member m in conversation c, and the unread cursor with the
# COALESCE fallback: my read cursor, else my last sent seq there, else 0.
_WIN_MIN = "GREATEST(c.min_seq, m.min_seq)"
_WIN_MAX = "LEAST(c.max_seq, COALESCE(m.max_seq, c.max_seq))"
_CURSOR = (
    "COALESCE(m.read_seq, (SELECT max(s.seq) FROM messages s WHERE s.conv_id = m.conv_id "
    "AND s.sender_id = m.user_id), 0)"
)
# the content types that never count as unread: the notices and system messages
NOT_COUNTED = ("recall", "system", "edit", "reaction")
_UNREAD = (
    "(SELECT count(*) FROM messages x WHERE x.conv_id = m.conv_id "
    f"AND x.seq > GREATEST({_CURSOR}, {_WIN_MIN} - 1) "
    "AND x.seq <= COALESCE(m.max_seq, 9223372036854775807) "
    f"AND x.sender_id <> m.user_id AND x.content_type NOT IN {NOT_COUNTED!r})"
)
# Of those, the ones that mention me or everyone: _UNREAD itself (so the rules cannot
# drift apart) plus the mention test. The first added condition is the predicate of the
# partial index messages_mentions (only messages that mention anyone, covering what this
# reads), so the count stays an index-only scan however long the unread backlog is.
assert _UNREAD.endswith(")")
_MENTION_UNREAD = (
    _UNREAD[:-1] + " AND (x.mention_all OR cardinality(x.mentions) > 0) "
    "AND (x.mention_all OR m.user_id = ANY(x.mentions)))"
)


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
