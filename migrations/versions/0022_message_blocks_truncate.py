"""A TRUNCATE of ``messages``, or of one of its partitions, empties the matching unread
blocks.

Migration 0021's statement triggers keep ``message_blocks`` for rows inserted into and
deleted from ``messages``. A TRUNCATE fires neither, so it left the blocks counting
messages that were gone, and unread counts too high for good. Now a TRUNCATE trigger on
each partition deletes the blocks of the conversations that hash to that partition
(``satisfies_hash_partition``: the test the partition's own bound makes). A TRUNCATE of
``messages`` fires the trigger of every partition.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

PARTITIONS = 16


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION message_blocks_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          DELETE FROM message_blocks
           WHERE satisfies_hash_partition('messages'::regclass, TG_ARGV[0]::int,
                                          TG_ARGV[1]::int, conv_id);
          RETURN NULL;
        END $$
        """
    )
    for i in range(PARTITIONS):
        op.execute(
            f"CREATE TRIGGER messages_p{i:02d}_blocks_truncated AFTER TRUNCATE ON messages_p{i:02d} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION message_blocks_truncated({PARTITIONS}, {i})"
        )


def downgrade() -> None:
    for i in range(PARTITIONS):
        op.execute(f"DROP TRIGGER messages_p{i:02d}_blocks_truncated ON messages_p{i:02d}")
    op.execute("DROP FUNCTION message_blocks_truncated()")
