"""Messages: batched idempotent inserts (the persister), history ranges, dedupe lookups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.protocol.types import MAX_INT64, SERVER_CONTENT_TYPES
from im_server.search_text import message_document
from im_server.storage.conversations import MESSAGE_COLUMNS, message_dict


@dataclass(slots=True)
class NewMessage:
    conv_id: str
    seq: int
    sender_id: int
    client_msg_id: str
    content_type: str
    content_json: str
    server_time: int
    mentions: list[int] = field(default_factory=list)
    mention_all: bool = False
    reply_to: int | None = None


class Persisted(NamedTuple):
    """What a batch's statement did: its sync version, the messages it inserted (the
    others were stored already) and the push outbox rows it wrote."""

    version: int
    inserted: int
    pushed: int = 0
    hooked: int = 0  # webhook deliveries written


# One statement per batch (one round trip, autocommit): take the next sync version,
# claim each message's dedupe key in message_dedupe (in batch order: of two messages with
# one key, the first claims it), insert the messages whose key this statement claimed
# (ON CONFLICT DO NOTHING on both: a replayed batch changes nothing; originals recalled
# within the batch go in blanked), blank the earlier originals of recall notices,
# and raise each conversation's persisted max_seq and version. With push on, the newly
# inserted user messages (not notices, not recalled) also get their push_outbox rows here,
# in the same commit: a stored message is never left unpushed by a crash. Only in
# conversations where some member holds a push registration (once per conversation of
# the batch): elsewhere nobody could get a push, and the pusher's work per row is what
# push costs the send path. Each message's search tokens (made in Python, see
# im_server/search_text.py) go in with it. With webhooks registered, each newly inserted
# message or notice that is an event (``message.created``, ``.edited``, ``.recalled``,
# ``member.added``, ``member.removed``) gets one webhook_outbox row per webhook taking
# that type, in the same commit: an event is never lost to a crash, and never written
# twice by a replayed batch. With none, the one-time EXISTS test skips the whole step. A picture or file message gets its message_uploads row (the
# access rule) and marks its upload sent (the clean-up spares it), in the same commit.
_NOT_PUSHED = sorted(SERVER_CONTENT_TYPES)
_PERSIST = """
WITH ver AS (
    UPDATE sync_version SET version = version + 1 WHERE id = 1 RETURNING version
), x AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                         $7::bigint[], $8::boolean[], $13::text[], $14::boolean[], $15::bigint[],
                         $18::text[])
           WITH ORDINALITY AS x(c, q, s, m, t, b, ts, rc, mn, ma, rt, sv, i)
), dd AS (
    INSERT INTO message_dedupe (sender_id, client_msg_id, conv_id, seq, server_time)
    SELECT s, m, c, q, ts FROM x ORDER BY i
    ON CONFLICT DO NOTHING
    RETURNING conv_id, seq
), ins AS (
    INSERT INTO messages (conv_id, seq, sender_id, client_msg_id, content_type, content, server_time, recalled,
                          mentions, mention_all, reply_to, search)
    SELECT c, q, s, m, t, CASE WHEN rc THEN NULL ELSE b::jsonb END, ts, rc, mn::bigint[], ma, rt,
           CASE WHEN rc THEN NULL ELSE sv::tsvector END
      FROM x WHERE (c, q) IN (SELECT conv_id, seq FROM dd)
    ON CONFLICT DO NOTHING
    RETURNING conv_id, seq, content_type, recalled, content ->> 'upload_id' AS upload_id
), carried AS (
    INSERT INTO message_uploads (upload_id, conv_id, seq)
    SELECT i.upload_id, i.conv_id, i.seq FROM ins i
     WHERE i.content_type IN ('image', 'file') AND i.upload_id IS NOT NULL
    ON CONFLICT DO NOTHING
), sent AS (
    UPDATE uploads u SET sent_at = (extract(epoch from clock_timestamp()) * 1000)::bigint
      FROM ins i
     WHERE i.content_type IN ('image', 'file') AND u.upload_id = i.upload_id
       AND u.sent_at IS NULL
), pushable AS (
    SELECT y.c FROM unnest($11::text[]) AS y(c)
     WHERE $16::boolean AND EXISTS (
           SELECT 1 FROM conv_members m JOIN push_registrations p ON p.user_id = m.user_id
            WHERE m.conv_id = y.c)
), push AS (
    INSERT INTO push_outbox (conv_id, seq, created_at)
    SELECT i.conv_id, i.seq, (extract(epoch from clock_timestamp()) * 1000)::bigint
      FROM ins i
     WHERE i.conv_id IN (SELECT c FROM pushable)
       AND NOT i.recalled AND i.content_type <> ALL($17::text[])
    ON CONFLICT DO NOTHING
    RETURNING 1
), hooked AS (
    INSERT INTO webhook_outbox (webhook_id, event_key, conv_key, type, data, created_at, next_at)
    SELECT w.webhook_id, 'msg_' || e.c || '_' || e.q, e.c, e.ty, e.d, e.now, e.now
      FROM (
        SELECT x.c, x.q, x.i,
               CASE x.t WHEN 'edit' THEN 'message.edited' WHEN 'recall' THEN 'message.recalled'
                 WHEN 'reaction' THEN NULL
                 WHEN 'system' THEN CASE x.b::jsonb ->> 'event'
                     WHEN 'members_added' THEN 'member.added'
                     WHEN 'member_kicked' THEN 'member.removed'
                     WHEN 'member_left' THEN 'member.removed' END
                 ELSE 'message.created' END AS ty,
               jsonb_build_object(
                 'conv_id', x.c, 'seq', x.q, 'sender_id', x.s, 'client_msg_id', x.m,
                 'content_type', x.t, 'content', CASE WHEN x.rc THEN NULL ELSE x.b::jsonb END,
                 'server_time', x.ts, 'recalled', x.rc, 'mentions', to_jsonb(x.mn::bigint[]),
                 'mention_all', x.ma, 'reply_to', x.rt, 'edited_at', NULL,
                 'reactions', '[]'::jsonb)
               || jsonb_strip_nulls(jsonb_build_object(
                 'external_id', (SELECT u.external_id FROM users u WHERE u.user_id = x.s),
                 'to_bots', (SELECT jsonb_agg(bot.user_id ORDER BY bot.user_id) FROM users bot
                              WHERE bot.kind = 'bot' AND bot.user_id <> x.s
                                AND bot.deleted_at IS NULL
                                AND (bot.user_id = ANY(x.mn::bigint[])
                                     OR (left(x.c, 2) = 's:' AND bot.user_id =
                                         ANY(string_to_array(substr(x.c, 3), ':')::bigint[])))
                                AND x.t NOT IN ('system', 'edit', 'recall', 'reaction')))) AS d,
               (extract(epoch from clock_timestamp()) * 1000)::bigint AS now
          FROM x JOIN ins ON ins.conv_id = x.c AND ins.seq = x.q
         WHERE EXISTS (SELECT 1 FROM webhooks WHERE deleted_at IS NULL)
      ) e
      JOIN webhooks w ON w.deleted_at IS NULL AND w.events && ARRAY['*', e.ty]
     WHERE e.ty IS NOT NULL
     ORDER BY e.i
    ON CONFLICT DO NOTHING
    RETURNING 1
), blank AS (
    UPDATE messages m SET content = NULL, recalled = true, search = NULL
      FROM unnest($9::text[], $10::bigint[]) AS r(c, q)
     WHERE m.conv_id = r.c AND m.seq = r.q
), conv AS (
    INSERT INTO conversations (conv_id, conv_type, max_seq, seq_reserved, version, created_at)
    SELECT c, CASE WHEN left(c, 2) = 'g:' THEN 2 ELSE 1 END, q, q, (SELECT version FROM ver),
           (extract(epoch from now()) * 1000)::bigint
      FROM unnest($11::text[], $12::bigint[]) AS y(c, q)
    ON CONFLICT (conv_id) DO UPDATE SET max_seq = GREATEST(conversations.max_seq, EXCLUDED.max_seq),
        seq_reserved = GREATEST(conversations.seq_reserved, EXCLUDED.max_seq), version = EXCLUDED.version
)
SELECT (SELECT version FROM ver), (SELECT count(*) FROM ins), (SELECT count(*) FROM push),
       (SELECT count(*) FROM hooked)
"""


def search_document(m: NewMessage) -> str | None:
    """The message's search tokens (``messages.search``): none for a notice."""
    if m.content_type in SERVER_CONTENT_TYPES:
        return None
    return message_document(m.content_json)


async def persist_batch(
    conn: asyncpg.Connection,
    batch: list[NewMessage],
    recalled_here: set[tuple[str, int]],
    blank: list[tuple[str, int]],
    push: bool = False,
) -> Persisted:
    """Write a batch with the statement above, on a plain asyncpg connection (the hot
    write path skips the pool and its per-checkout ping). ``push``: write the push outbox
    rows too."""
    tops: dict[str, int] = {}
    for m in batch:
        if m.seq > tops.get(m.conv_id, 0):
            tops[m.conv_id] = m.seq
    convs = sorted(tops)  # a fixed lock order across persisters
    row = await conn.fetchrow(
        _PERSIST,
        [m.conv_id for m in batch],
        [m.seq for m in batch],
        [m.sender_id for m in batch],
        [m.client_msg_id for m in batch],
        [m.content_type for m in batch],
        [m.content_json for m in batch],
        [m.server_time for m in batch],
        [(m.conv_id, m.seq) in recalled_here for m in batch],
        [x[0] for x in blank],
        [x[1] for x in blank],
        convs,
        [tops[c] for c in convs],
        # each message's mentions as an array literal: unnest cannot take ragged arrays
        ["{" + ",".join(map(str, m.mentions)) + "}" for m in batch],
        [m.mention_all for m in batch],
        [m.reply_to for m in batch],
        push,
        _NOT_PUSHED,
        [search_document(m) for m in batch],
    )
    assert row is not None
    return Persisted(int(row[0]), int(row[1]), int(row[2]), int(row[3]))


async def touch_filled_windows(conn: asyncpg.Connection, batch: list[NewMessage]) -> list[int]:
    """After a batch committed: members whose closed window (kicked, left) the batch
    filled in get a new sync version, since new messages no longer reach their state
    otherwise. Run after the commit, in a snapshot of its own, so a kick that committed
    while the batch was writing is seen; a kick committing later takes a later version
    itself. Returns the users touched."""
    lows: dict[str, int] = {}
    for m in batch:
        if m.seq < lows.get(m.conv_id, MAX_INT64):
            lows[m.conv_id] = m.seq
    convs = sorted(lows)
    hits = await conn.fetch(
        "SELECT m.conv_id, m.user_id FROM conv_members m "
        "JOIN unnest($1::text[], $2::bigint[]) AS z(c, lo) ON m.conv_id = z.c "
        "WHERE m.max_seq IS NOT NULL AND m.max_seq >= z.lo",
        convs,
        [lows[c] for c in convs],
    )
    if not hits:
        return []
    async with conn.transaction():
        version = await conn.fetchval(
            "UPDATE sync_version SET version = version + 1 WHERE id = 1 RETURNING version"
        )
        await conn.execute(
            "UPDATE conv_members m SET version = $3 FROM unnest($1::text[], $2::bigint[]) AS h(c, u) "
            "WHERE m.conv_id = h.c AND m.user_id = h.u",
            [h[0] for h in hits],
            [h[1] for h in hits],
            version,
        )
    return sorted({int(h[1]) for h in hits})


async def release_taken_keys(
    conn: AsyncConnection, batch: list[NewMessage]
) -> list[tuple[str, int]]:
    """Give back the dedupe keys the batch claimed for a (conv_id, seq) that holds another
    message, and return those (conv_id, seq). Seqs are never handed out twice, so this
    finds nothing; were one reused, the persist statement would claim the key (it does
    not probe messages, to stay one index insert per row) while the message is refused
    by the primary key, and the key must not answer a resend with a seq that shows
    another message. Run after any batch that stored fewer rows than it holds (replays
    included), so a crash between the two leaves nothing behind."""
    r = await conn.execute(
        text(
            "DELETE FROM message_dedupe d USING unnest(CAST(:s AS bigint[]), CAST(:m AS text[]), "
            "CAST(:c AS text[]), CAST(:q AS bigint[])) AS x(s, m, c, q) "
            "WHERE d.sender_id = x.s AND d.client_msg_id = x.m AND d.conv_id = x.c AND d.seq = x.q "
            "AND EXISTS (SELECT 1 FROM messages e WHERE e.conv_id = x.c AND e.seq = x.q "
            "AND (e.sender_id <> x.s OR e.client_msg_id <> x.m)) "
            "RETURNING d.conv_id, d.seq"
        ),
        {
            "s": [m.sender_id for m in batch],
            "m": [m.client_msg_id for m in batch],
            "c": [m.conv_id for m in batch],
            "q": [m.seq for m in batch],
        },
    )
    return sorted((str(c), int(q)) for c, q in r)


async def blank_recalled(conn: AsyncConnection, targets: list[tuple[str, int]]) -> None:
    if not targets:
        return
    await conn.execute(
        text(
            "UPDATE messages m SET content = NULL, recalled = true, search = NULL FROM unnest(CAST(:c AS text[]), "
            "CAST(:q AS bigint[])) AS x(c, q) WHERE m.conv_id = x.c AND m.seq = x.q"
        ),
        {"c": [t[0] for t in targets], "q": [t[1] for t in targets]},
    )


async def by_dedupe_keys(
    conn: AsyncConnection, pairs: list[tuple[int, str]]
) -> dict[tuple[int, str], tuple[str, int, int]]:
    """{(sender, client_msg_id): (conv_id, seq, server_time)} of the pairs stored, from
    message_dedupe alone (keyed by sender, so no conversation needs to be known)."""
    r = await conn.execute(
        text(
            "SELECT d.sender_id, d.client_msg_id, d.conv_id, d.seq, d.server_time FROM message_dedupe d "
            "JOIN unnest(CAST(:s AS bigint[]), CAST(:c AS text[])) AS x(s, c) "
            "ON d.sender_id = x.s AND d.client_msg_id = x.c"
        ),
        {"s": [p[0] for p in pairs], "c": [p[1] for p in pairs]},
    )
    return {(int(a), str(b)): (str(c), int(d), int(e)) for a, b, c, d, e in r}


async def message_range(
    conn: AsyncConnection, conv_id: str, begin: int, end: int, descending: bool
) -> list[dict[str, Any]]:
    order = "DESC" if descending else "ASC"
    r = await conn.execute(
        text(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conv_id = :c AND seq BETWEEN :b AND :e ORDER BY seq {order}"
        ),
        {"c": conv_id, "b": begin, "e": end},
    )
    return [message_dict(row) for row in r]


async def message_at(conn: AsyncConnection, conv_id: str, seq: int) -> dict[str, Any] | None:
    row = (
        await conn.execute(
            text(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conv_id = :c AND seq = :q"),
            {"c": conv_id, "q": seq},
        )
    ).first()
    return message_dict(row) if row else None


async def any_messages(conn: AsyncConnection) -> bool:
    """Whether PostgreSQL holds any stored message, asked of message_dedupe (every
    stored message has its row there): the one question about messages that names no
    conversation reads the table the dedupe recheck it decides on reads."""
    r = await conn.execute(text("SELECT EXISTS (SELECT 1 FROM message_dedupe)"))
    return bool(r.scalar_one())


async def absent(conn: AsyncConnection, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Those (conv_id, seq) that have no row."""
    r = await conn.execute(
        text(
            "SELECT x.c, x.q FROM unnest(CAST(:c AS text[]), CAST(:q AS bigint[])) AS x(c, q) "
            "WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.conv_id = x.c AND m.seq = x.q)"
        ),
        {"c": [k[0] for k in keys], "q": [k[1] for k in keys]},
    )
    return [(str(a), int(b)) for a, b in r]
