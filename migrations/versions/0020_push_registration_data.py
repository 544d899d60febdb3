"""Push registration data: what a gateway needs besides the pushkey to deliver to a
device, sent as that device's ``devices[].data`` (Web Push: the subscription's
``endpoint`` and ``auth``); ``{}`` for APNs and FCM. The platform check admits
``webpush``.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE push_registrations ADD COLUMN data JSONB NOT NULL DEFAULT '{}'::jsonb")
    op.execute("ALTER TABLE push_registrations DROP CONSTRAINT push_registrations_platform_check")
    op.execute(
        "ALTER TABLE push_registrations ADD CONSTRAINT push_registrations_platform_check "
        "CHECK (platform IN ('apns', 'fcm', 'webpush'))"
    )


def downgrade() -> None:
    op.execute("DELETE FROM push_registrations WHERE platform = 'webpush'")
    op.execute("ALTER TABLE push_registrations DROP CONSTRAINT push_registrations_platform_check")
    op.execute(
        "ALTER TABLE push_registrations ADD CONSTRAINT push_registrations_platform_check "
        "CHECK (platform IN ('apns', 'fcm'))"
    )
    op.execute("ALTER TABLE push_registrations DROP COLUMN data")
