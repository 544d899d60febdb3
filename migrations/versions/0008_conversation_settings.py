"""Per-user conversation settings: ``muted`` and ``pinned`` on the member row (a single
chat has a row per side, so each side has its own), and ``settings_version``, the sync
version of their last change. It is apart from the row's ``version`` because a single
chat's state also carries the peer row's ``version`` (the peer's cursors): a settings
change must move my state only, or the peer would see a change, and learn that I muted
or pinned. Adding columns with constant defaults rewrites nothing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE conv_members ADD COLUMN muted BOOLEAN NOT NULL DEFAULT false, "
        "ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT false, "
        "ADD COLUMN settings_version BIGINT NOT NULL DEFAULT 0"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE conv_members DROP COLUMN muted, DROP COLUMN pinned, "
        "DROP COLUMN settings_version"
    )
