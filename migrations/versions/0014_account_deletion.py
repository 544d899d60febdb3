"""Account deletion: ``users.deleted_at`` (ms, null = live) is set in the transaction
that frees the username and revokes every session; ``users.cleaned_at`` (ms) is set once
the rest (leaving every group, push registrations) is done. A partial index finds the
deleted users whose clean-up is still to do, for the periodic job that finishes a
deletion whose process died half-way.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE users ADD COLUMN IF NOT EXISTS deleted_at BIGINT")
    op.execute("ALTER TABLE users ADD COLUMN IF NOT EXISTS cleaned_at BIGINT")
    op.execute(
        "CREATE INDEX IF NOT EXISTS users_deletion_pending ON users (deleted_at) "
        "WHERE deleted_at IS NOT NULL AND cleaned_at IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS users_deletion_pending")
    op.execute("ALTER TABLE users DROP COLUMN IF EXISTS cleaned_at")
    op.execute("ALTER TABLE users DROP COLUMN IF EXISTS deleted_at")
