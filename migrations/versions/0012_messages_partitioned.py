"""``messages`` hash-partitioned by ``conv_id``; dedupe keys in a table of their own.

- ``messages`` becomes ``PARTITION BY HASH (conv_id)`` with 16 partitions,
  ``messages_p00`` .. ``messages_p15``. Every statement on it names ``conv_id``, so a
  conversation's reads touch one partition, and the same keys would distribute the table
  by ``conv_id`` on a sharded PostgreSQL. The primary key stays ``(conv_id, seq)
  INCLUDE (sender_id, content_type)`` and ``messages_sender``, ``messages_mentions``
  (partial, covering) keep their columns, so the unread count stays index-only. Each
  partition's indexes are named after it (``messages_p03_pkey``, ``messages_p03_sender``,
  ``messages_p03_mentions``), which is what a plan shows.
- A unique index on a partitioned table must contain the partition key, so
  ``messages_dedupe (sender_id, client_msg_id)`` cannot stay. It becomes the table
  ``message_dedupe``: primary key ``(sender_id, client_msg_id)``, the ``(conv_id, seq)``
  it was stored under and its ``server_time`` (what a duplicate's ack repeats, so the
  lookup reads this table alone). The persister writes it in the statement that stores
  the messages; it is keyed by sender so it could be distributed by ``sender_id``.

The conversion runs in place, in this migration's one transaction: the new table is
built beside the old one, the rows are copied (the dedupe rows from the same rows),
the old table is dropped and the new one takes its name, then the indexes are built
over the copied rows. No foreign key points at ``messages`` (reactions, edits, uploads
and outboxes refer to a message by ``(conv_id, seq)`` without one), so none is moved.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

PARTITIONS = 16

_MENTIONS_COLUMNS = (
    "(conv_id, seq) INCLUDE (sender_id, content_type, mention_all, mentions) "
    "WHERE mention_all OR cardinality(mentions) > 0"
)


def _no_foreign_keys_to_messages() -> None:
    """A foreign key to ``messages`` would be dropped with the old table; none exists
    today, and one added later must be moved by hand, so refuse rather than lose it."""
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_constraint
                        WHERE contype = 'f' AND confrelid = 'messages'::regclass) THEN
                RAISE EXCEPTION 'a foreign key references messages: move it in this migration';
            END IF;
        END $$
        """
    )


def upgrade() -> None:
    _no_foreign_keys_to_messages()
    op.execute(
        """
        CREATE TABLE message_dedupe (
            sender_id      BIGINT NOT NULL,
            client_msg_id  TEXT NOT NULL,
            conv_id        TEXT NOT NULL,
            seq            BIGINT NOT NULL,
            server_time    BIGINT NOT NULL,
            PRIMARY KEY (sender_id, client_msg_id)
        )
        """
    )
    op.execute(
        "INSERT INTO message_dedupe (sender_id, client_msg_id, conv_id, seq, server_time) "
        "SELECT sender_id, client_msg_id, conv_id, seq, server_time FROM messages"
    )
    # the same columns, types and defaults, in the same order
    op.execute(
        "CREATE TABLE messages_partitioned (LIKE messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY HASH (conv_id)"
    )
    for i in range(PARTITIONS):
        op.execute(
            f"CREATE TABLE messages_p{i:02d} PARTITION OF messages_partitioned "
            f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        )
    op.execute("INSERT INTO messages_partitioned SELECT * FROM messages")
    op.execute("DROP TABLE messages")
    op.execute("ALTER TABLE messages_partitioned RENAME TO messages")
    # the partitions' primary keys are named messages_pNN_pkey
    op.execute(
        "ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (conv_id, seq) "
        "INCLUDE (sender_id, content_type)"
    )
    op.execute("CREATE INDEX messages_sender ON ONLY messages (conv_id, sender_id, seq)")
    op.execute(f"CREATE INDEX messages_mentions ON ONLY messages {_MENTIONS_COLUMNS}")
    for i in range(PARTITIONS):
        p = f"messages_p{i:02d}"
        op.execute(f"CREATE INDEX {p}_sender ON {p} (conv_id, sender_id, seq)")
        op.execute(f"ALTER INDEX messages_sender ATTACH PARTITION {p}_sender")
        op.execute(f"CREATE INDEX {p}_mentions ON {p} {_MENTIONS_COLUMNS}")
        op.execute(f"ALTER INDEX messages_mentions ATTACH PARTITION {p}_mentions")
    # statistics now, so the first statements after the migration are planned on them
    op.execute("ANALYZE messages")
    op.execute("ANALYZE message_dedupe")


def downgrade() -> None:
    op.execute(
        "CREATE TABLE messages_plain (LIKE messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("INSERT INTO messages_plain SELECT * FROM messages")
    op.execute("DROP TABLE messages")  # and its partitions
    op.execute("ALTER TABLE messages_plain RENAME TO messages")
    op.execute(
        "ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (conv_id, seq) "
        "INCLUDE (sender_id, content_type)"
    )
    op.execute("CREATE UNIQUE INDEX messages_dedupe ON messages (sender_id, client_msg_id)")
    op.execute("CREATE INDEX messages_sender ON messages (conv_id, sender_id, seq)")
    op.execute(f"CREATE INDEX messages_mentions ON messages {_MENTIONS_COLUMNS}")
    op.execute("DROP TABLE message_dedupe")
    op.execute("ANALYZE messages")
