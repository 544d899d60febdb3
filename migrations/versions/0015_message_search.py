"""Search: ``messages.search`` (a ``tsvector`` of the tokens made by
``im_server.search_text``) under a GIN index on ``(conv_id, search)``.

- The tokens are made in Python (see ``im_server/search_text.py`` for why), written by
  the persister with each message, replaced by an edit and cleared by a recall; a notice,
  a picture or a message without text has none.
- The index is per partition (``messages_pNN_search``, attached to ``messages_search``),
  partial (only rows that have tokens) and leads with ``conv_id`` (``btree_gin``), so a
  search in one of my conversations intersects that conversation's entries with the
  query's tokens inside one index scan instead of reading every conversation's matches.
- ``messages_search_time`` (per partition ``messages_pNN_search_time``) on ``(conv_id,
  server_time, seq)``, same rows: a conversation where the query is common is read newest
  first through it, a few rows per result, instead of reading every match.
- ``fastupdate`` is off: a search never scans a pending list, and the persister pays
  for the index entries in its batch (measured in ``benchmarks/search.py``).

The messages stored before this migration get their tokens here, in batches.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

from im_server.protocol.types import SERVER_CONTENT_TYPES
from im_server.search_text import message_document

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

PARTITIONS = 16
_TIME_COLUMNS = "(conv_id, server_time, seq) WHERE search IS NOT NULL"
_BATCH = 2000


def _backfill() -> None:
    bind = op.get_bind()
    last = ("", 0)
    while True:
        rows = bind.execute(
            sa.text(
                "SELECT conv_id, seq, content::text FROM messages "
                "WHERE (conv_id, seq) > (:c, :q) AND NOT recalled AND content IS NOT NULL "
                "AND content_type <> ALL(CAST(:notices AS text[])) "
                "ORDER BY conv_id, seq LIMIT :n"
            ),
            {"c": last[0], "q": last[1], "n": _BATCH, "notices": sorted(SERVER_CONTENT_TYPES)},
        ).all()
        if not rows:
            return
        last = (rows[-1][0], rows[-1][1])
        docs = [(r[0], r[1], message_document(r[2])) for r in rows]
        docs = [d for d in docs if d[2] is not None]
        if docs:
            bind.execute(
                sa.text(
                    "UPDATE messages m SET search = CAST(x.d AS tsvector) "
                    "FROM unnest(CAST(:c AS text[]), CAST(:q AS bigint[]), CAST(:d AS text[])) "
                    "AS x(c, q, d) WHERE m.conv_id = x.c AND m.seq = x.q"
                ),
                {"c": [d[0] for d in docs], "q": [d[1] for d in docs], "d": [d[2] for d in docs]},
            )


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    op.execute("ALTER TABLE messages ADD COLUMN IF NOT EXISTS search tsvector")
    _backfill()
    op.execute(
        "CREATE INDEX messages_search ON ONLY messages USING gin (conv_id, search) "
        "WITH (fastupdate = off) WHERE search IS NOT NULL"
    )
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        op.execute(
            f"CREATE INDEX {p}_search ON {p} USING gin (conv_id, search) "
            "WITH (fastupdate = off) WHERE search IS NOT NULL"
        )
        op.execute(f"ALTER INDEX messages_search ATTACH PARTITION {p}_search")
    op.execute(f"CREATE INDEX messages_search_time ON ONLY messages {_TIME_COLUMNS}")
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        op.execute(f"CREATE INDEX {p}_search_time ON {p} {_TIME_COLUMNS}")
        op.execute(f"ALTER INDEX messages_search_time ATTACH PARTITION {p}_search_time")
    op.execute("ANALYZE messages")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS messages_search_time")
    op.execute("DROP INDEX IF EXISTS messages_search")
    op.execute("ALTER TABLE messages DROP COLUMN IF EXISTS search")
