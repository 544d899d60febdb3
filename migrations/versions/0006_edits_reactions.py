"""Edits and reactions.

- ``messages.edited_at`` (ms) and ``messages.edit_seq``: when the message was last edited
  and the seq of the edit notice that set its content. An edit is applied only by a
  notice of a higher seq than the one applied (``edit_seq``), so the request and the
  persister may both apply it, in any order, and the newest edit wins.
- ``reactions``: one row per (message, user, emoji).
- ``reaction_counts``: one row per (message, emoji) with its count, kept in the same
  transaction as ``reactions``, so reading a message's reactions never scans the
  per-user rows.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DDL = """
ALTER TABLE messages ADD COLUMN edited_at BIGINT, ADD COLUMN edit_seq BIGINT;

CREATE TABLE reactions (
    conv_id     TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    user_id     BIGINT NOT NULL,
    emoji       TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (conv_id, seq, user_id, emoji)
);

CREATE TABLE reaction_counts (
    conv_id  TEXT NOT NULL,
    seq      BIGINT NOT NULL,
    emoji    TEXT NOT NULL,
    count    INTEGER NOT NULL CHECK (count > 0),
    PRIMARY KEY (conv_id, seq, emoji)
)
"""


def upgrade() -> None:
    for statement in DDL.split(";\n"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS reaction_counts, reactions")
    op.execute("ALTER TABLE messages DROP COLUMN IF EXISTS edit_seq")
    op.execute("ALTER TABLE messages DROP COLUMN IF EXISTS edited_at")
