"""Friendships looked up from either side.

The primary key ``(user_a, user_b)`` serves "friends of u" only when u is the smaller id;
the other half (``WHERE user_b = u``: the friend list, who sees my presence) scanned the
table. ``friendships_b`` makes both halves index scans.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS friendships_b ON friendships (user_b, user_a)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS friendships_b")
