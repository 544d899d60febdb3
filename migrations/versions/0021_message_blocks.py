"""Unread counts that do not visit each unread message: ``message_blocks`` holds, per
conversation and block of 64 seqs, how many messages in it can count as unread (not a
notice: recall, system, edit, reaction) and how many of those mention anyone. An unread
count becomes a sum over the blocks between the cursor and the end, corrected by the
countable messages between the cursor and the nearer end of its block (half a block at
most), less my own. The blocks are kept by statement triggers on ``messages`` (the same
transaction as the rows, whoever writes them, in whatever order: a late or re-queued
message only adds to its block), and filled here from the rows stored before.

``messages_sender`` is built again with ``content_type`` included, so that counting my
own countable messages reads the index alone.

The notice types are written into the trigger: a new notice type needs a migration that
replaces ``message_blocks_add`` and ``message_blocks_remove`` and refills the table.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

BLOCK = 64
PARTITIONS = 16
NOTICES = "('recall', 'system', 'edit', 'reaction')"
MENTIONING = "(mention_all OR cardinality(mentions) > 0)"


def _counted(rows: str) -> str:
    """Each block's countable and mentioning messages among ``rows``, in key order (so
    that two writers take the rows' locks in one order)."""
    return (
        f"SELECT conv_id, seq / {BLOCK}, count(*), count(*) FILTER (WHERE {MENTIONING}) "
        f"FROM {rows} WHERE content_type NOT IN {NOTICES} GROUP BY 1, 2 ORDER BY 1, 2"
    )


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE message_blocks (
            conv_id     TEXT NOT NULL,
            blk         BIGINT NOT NULL,
            countable   INTEGER NOT NULL,
            mentioning  INTEGER NOT NULL,
            PRIMARY KEY (conv_id, blk)
        ) WITH (fillfactor = 70)
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION message_blocks_add() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO message_blocks AS b (conv_id, blk, countable, mentioning)
          {_counted("new_rows")}
          ON CONFLICT (conv_id, blk) DO UPDATE
             SET countable = b.countable + EXCLUDED.countable,
                 mentioning = b.mentioning + EXCLUDED.mentioning;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION message_blocks_remove() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          UPDATE message_blocks b SET countable = b.countable - o.n, mentioning = b.mentioning - o.k
            FROM ({_counted("old_rows")}) AS o(conv_id, blk, n, k)
           WHERE b.conv_id = o.conv_id AND b.blk = o.blk;
          RETURN NULL;
        END $$
        """
    )
    # created before the fill, in this transaction: the trigger's lock holds back writers
    # until the commit, so no row is counted twice or missed
    op.execute(
        "CREATE TRIGGER messages_blocks_add AFTER INSERT ON messages "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
        "EXECUTE FUNCTION message_blocks_add()"
    )
    op.execute(
        "CREATE TRIGGER messages_blocks_remove AFTER DELETE ON messages "
        "REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT "
        "EXECUTE FUNCTION message_blocks_remove()"
    )
    op.execute(
        f"INSERT INTO message_blocks (conv_id, blk, countable, mentioning) {_counted('messages')}"
    )
    _sender_index(include=True)
    op.execute("ANALYZE message_blocks")


def downgrade() -> None:
    _sender_index(include=False)
    op.execute("DROP TRIGGER messages_blocks_remove ON messages")
    op.execute("DROP TRIGGER messages_blocks_add ON messages")
    op.execute("DROP FUNCTION message_blocks_remove()")
    op.execute("DROP FUNCTION message_blocks_add()")
    op.execute("DROP TABLE message_blocks")


def _sender_index(*, include: bool) -> None:
    """``messages_sender`` on every partition, with or without ``content_type``."""
    extra = " INCLUDE (content_type)" if include else ""
    op.execute("DROP INDEX messages_sender")  # and its partitions' indexes
    op.execute(f"CREATE INDEX messages_sender ON ONLY messages (conv_id, sender_id, seq){extra}")
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        op.execute(f"CREATE INDEX {p}_sender ON {p} (conv_id, sender_id, seq){extra}")
        op.execute(f"ALTER INDEX messages_sender ATTACH PARTITION {p}_sender")
