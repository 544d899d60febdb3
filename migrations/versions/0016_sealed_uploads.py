"""Sealed uploads: once a send names an upload, the server copies its bytes to a key the
client never had a URL for (``s/<upload_id>``) and checks that copy; every download and
thumbnail reads it from then on, so a later PUT to the upload's presigned URL changes
nothing anyone downloads.

- ``sealed_at``: when the copy was made and checked (NULL: the bytes are still only at
  the client's key ``u/<upload_id>``, as for every upload stored before this migration,
  which keep being read there until a send seals them).
- ``raw_cleared_at``: when the client's key was deleted, after its presigned URL expired
  (nothing can write it again then). ``uploads_raw_due`` finds the sealed ones left.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE uploads ADD COLUMN sealed_at BIGINT, ADD COLUMN raw_cleared_at BIGINT")
    op.execute(
        "CREATE INDEX uploads_raw_due ON uploads (sealed_at) "
        "WHERE sealed_at IS NOT NULL AND raw_cleared_at IS NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS uploads_raw_due")
    op.execute("ALTER TABLE uploads DROP COLUMN raw_cleared_at, DROP COLUMN sealed_at")
