"""The pusher's durable work: one row per message to push, one per user whose badge to
send again.

``push_outbox`` rows are written by the persister in the statement that stores the
messages (only user messages, only newly inserted ones, only while a push gateway is
configured), so a message that is in PostgreSQL is pushed even if every process dies
right after the commit. ``push_badge`` rows are written by the read-cursor flush in its
own statement when a read moves a cursor of a user with a push registration; ``due_at``
is when the coalescing of a burst of reads ends and ``gen`` counts reads that arrived
while a push for the row was in flight (the row stays for one more push).

Both are leased, not locked, while a gateway call is in flight (``lease_until``, ms), so
no transaction stays open during HTTP calls and a crashed pusher's rows come back by
themselves once the lease passes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE push_outbox (
            conv_id     TEXT NOT NULL,
            seq         BIGINT NOT NULL,
            created_at  BIGINT NOT NULL,
            lease_until BIGINT NOT NULL DEFAULT 0,
            attempts    INT NOT NULL DEFAULT 0,
            PRIMARY KEY (conv_id, seq)
        )
        """
    )
    op.execute("CREATE INDEX push_outbox_created ON push_outbox (created_at)")
    op.execute(
        """
        CREATE TABLE push_badge (
            user_id     BIGINT PRIMARY KEY,
            due_at      BIGINT NOT NULL,
            gen         INT NOT NULL DEFAULT 0,
            lease_until BIGINT NOT NULL DEFAULT 0
        )
        """
    )
    op.execute("CREATE INDEX push_badge_due ON push_badge (due_at)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS push_badge")
    op.execute("DROP TABLE IF EXISTS push_outbox")
