"""Webhooks: the app's receivers, and the outbox of their deliveries.

- ``webhooks``: a receiver's URL, the event types it takes, its signing secret (kept as
  given, since it signs), the previous secret and until when it still signs (a day
  after a rotation), and when it was deleted.
- ``webhook_outbox``: one row per (webhook, event), written in the commit of what the
  event describes (the persister's batch for messages and notices, the account's
  transaction for users). ``event_key`` is the ``webhook-id`` header, the same on every
  retry; ``conv_key`` the order key (the conversation, or ``user:<id>``): a row is sent
  only when it is the oldest pending one of its (webhook, conv_key). Status 0 pending,
  1 delivered, 2 failed (after the retry window); ``lease_until`` is a delivering
  process's claim, so a row whose process died is taken again.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def _run(ddl: str) -> None:
    for statement in ddl.split(";\n"):
        if statement.strip():
            op.execute(statement)


def upgrade() -> None:
    _run(
        """
CREATE TABLE webhooks (
    webhook_id      BIGSERIAL PRIMARY KEY,
    url             TEXT NOT NULL,
    events          TEXT[] NOT NULL,
    secret          TEXT NOT NULL,
    old_secret      TEXT,
    old_secret_until BIGINT,
    created_at      BIGINT NOT NULL,
    deleted_at      BIGINT
);
CREATE TABLE webhook_outbox (
    delivery_id     BIGSERIAL PRIMARY KEY,
    webhook_id      BIGINT NOT NULL REFERENCES webhooks(webhook_id) ON DELETE CASCADE,
    event_key       TEXT NOT NULL,
    conv_key        TEXT NOT NULL,
    type            TEXT NOT NULL,
    data            JSONB NOT NULL,
    created_at      BIGINT NOT NULL,
    status          SMALLINT NOT NULL DEFAULT 0,
    attempts        INT NOT NULL DEFAULT 0,
    next_at         BIGINT NOT NULL,
    lease_until     BIGINT,
    last_error      TEXT,
    delivered_at    BIGINT,
    UNIQUE (webhook_id, event_key)
);
CREATE INDEX webhook_outbox_queue ON webhook_outbox (webhook_id, conv_key, delivery_id)
    WHERE status = 0;
CREATE INDEX webhook_outbox_failed ON webhook_outbox (webhook_id, delivery_id) WHERE status = 2;
CREATE INDEX webhook_outbox_done ON webhook_outbox (delivered_at) WHERE status = 1;
"""
    )


def downgrade() -> None:
    _run(
        """
DROP TABLE IF EXISTS webhook_outbox;
DROP TABLE IF EXISTS webhooks;
"""
    )
