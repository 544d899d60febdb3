"""The notice outbox: a server-made message (a reaction notice, a membership change) is
written here in the same transaction as the change it announces, and sent from here;
its row is deleted once the seq stream holds it. A process that dies between the commit
and the send leaves the row, and another process's sweep sends it, under the
client_msg_id chosen when the row was written, so a notice sent twice is deduplicated
to one seq (and, being random, no client can take it first).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE notice_outbox (
            id            BIGSERIAL PRIMARY KEY,
            conv_id       TEXT NOT NULL,
            actor_id      BIGINT NOT NULL,
            client_msg_id TEXT NOT NULL,
            content_type  TEXT NOT NULL,
            content       TEXT NOT NULL,
            created_at    BIGINT NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS notice_outbox")
