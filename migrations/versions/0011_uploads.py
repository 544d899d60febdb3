"""Uploads: files and pictures whose bytes live in the S3-compatible store.

``uploads`` holds what the server knows of each object: who made it, the size and type
it declared (the presigned PUT is bound to them), when a send last checked it
(``claimed_at``) and when a stored message first carried it (``sent_at``, written by the
persister). An upload with no ``sent_at`` is deleted once both its creation and its last
claim are older than ``IM_UPLOAD_UNSENT_HOURS``. For an
image, ``thumb_state`` drives the thumbnail worker: ``pending`` rows are leased
(``thumb_lease_until``, ms) like the pusher's, so a worker killed mid-job leaves the row
to be taken again.

``message_uploads`` says which messages carry which upload. The persister writes it in
the statement that stores the messages, so the access rule ("a user whose window holds a
non-recalled message carrying it") is one indexed join, and a message that is stored
always has its row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE uploads (
            upload_id         TEXT PRIMARY KEY,
            owner_id          BIGINT NOT NULL,
            content_type      TEXT NOT NULL,
            size              BIGINT NOT NULL,
            filename          TEXT,
            created_at        BIGINT NOT NULL,
            claimed_at        BIGINT,
            sent_at           BIGINT,
            width             INT,
            height            INT,
            thumb_state       TEXT NOT NULL DEFAULT 'none'
                              CHECK (thumb_state IN ('none', 'pending', 'done', 'failed')),
            thumb_type        TEXT,
            thumb_lease_until BIGINT NOT NULL DEFAULT 0,
            thumb_attempts    INT NOT NULL DEFAULT 0
        )
        """
    )
    op.execute("CREATE INDEX uploads_unsent ON uploads (created_at) WHERE sent_at IS NULL")
    op.execute(
        "CREATE INDEX uploads_thumb_due ON uploads (thumb_lease_until) WHERE thumb_state = 'pending'"
    )
    op.execute(
        """
        CREATE TABLE message_uploads (
            upload_id  TEXT NOT NULL,
            conv_id    TEXT NOT NULL,
            seq        BIGINT NOT NULL,
            PRIMARY KEY (upload_id, conv_id, seq)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS message_uploads")
    op.execute("DROP TABLE IF EXISTS uploads")
