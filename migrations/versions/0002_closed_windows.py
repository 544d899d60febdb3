"""Index of closed windows (kicked, left), for the persister's look-up of members whose
window a batch fills in.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX conv_members_closed ON conv_members (conv_id, max_seq) WHERE max_seq IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS conv_members_closed")
