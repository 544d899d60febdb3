"""Mentions and replies on messages.

- ``messages.mentions``: the user ids a group message mentions (members at send time),
  empty when none; ``messages.mention_all``: the message mentions every member;
  ``messages.reply_to``: the seq it answers, or NULL. Adding columns with constant
  defaults rewrites nothing.
- ``messages_mentions``: a partial index over the few messages that mention anyone,
  covering what ``mention_unread`` reads (sender, type, mentions), so that count is an
  index-only range scan next to the unread count's scan of ``messages_pkey``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE messages ADD COLUMN mentions BIGINT[] NOT NULL DEFAULT '{}', "
        "ADD COLUMN mention_all BOOLEAN NOT NULL DEFAULT false, "
        "ADD COLUMN reply_to BIGINT"
    )
    op.execute(
        "CREATE INDEX messages_mentions ON messages (conv_id, seq) "
        "INCLUDE (sender_id, content_type, mention_all, mentions) "
        "WHERE mention_all OR cardinality(mentions) > 0"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS messages_mentions")
    op.execute(
        "ALTER TABLE messages DROP COLUMN reply_to, DROP COLUMN mention_all, DROP COLUMN mentions"
    )
