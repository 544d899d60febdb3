"""Group moderation: a member muted by the owner or an admin until a time.

``conv_members.muted_until`` (ms, null = never muted or lifted) is read with the rest of
a group's send permissions: a member whose time has not come is cached as
``muted:<until>`` and the send script compares it with the send's own time, so a mute
ends on time without anything being invalidated.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE conv_members ADD COLUMN IF NOT EXISTS muted_until BIGINT")


def downgrade() -> None:
    op.execute("ALTER TABLE conv_members DROP COLUMN IF EXISTS muted_until")
