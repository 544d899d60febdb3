"""Session labels: what a person reads in "my devices" (a name given at login, or the
browser and platform read from the login's User-Agent); empty when neither was known.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions ADD COLUMN label TEXT NOT NULL DEFAULT ''")


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN label")
