"""Push registrations: a phone's push address (APNs or FCM token) tied to one session.

One row per session (the token that registered it): a session's end deletes its row in
the same transaction (the revocations in ``storage/accounts.py``), and the foreign key
cascades should a session row ever be deleted. ``(app_id, pushkey)`` is unique: when the
same phone registers under another session (the app re-installed, another account signed
in on it) the older row goes, so one phone never gets another session's pushes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE push_registrations (
            token_hash  BYTEA PRIMARY KEY REFERENCES sessions(token_hash) ON DELETE CASCADE,
            user_id     BIGINT NOT NULL,
            device_id   TEXT NOT NULL,
            app_id      TEXT NOT NULL,
            pushkey     TEXT NOT NULL,
            platform    TEXT NOT NULL CHECK (platform IN ('apns', 'fcm')),
            created_at  BIGINT NOT NULL,
            CONSTRAINT push_registrations_pushkey UNIQUE (app_id, pushkey)
        )
        """
    )
    op.execute("CREATE INDEX push_registrations_user ON push_registrations (user_id)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS push_registrations")
