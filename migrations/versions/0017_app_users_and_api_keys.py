"""The app's servers: API keys, users by the app's own id, minted tokens, idempotent writes.

- ``api_keys``: one row per key, the key stored only as SHA-256 (it is 32 random bytes,
  so a fast hash is enough: nothing to guess), its scopes, when it was revoked.
- ``users.external_id``: the app's id for the user, unique among live users (a deleted
  user keeps it, so an app-signed token issued before the deletion is refused, and the
  app may create the id again); ``users.kind``: ``user`` or ``bot``;
  ``users.tokens_valid_after`` (ms): a token issued before it (a session created before,
  an app-signed JWT whose ``iat`` is before) is refused ("revoke every token").
- ``sessions.expires_at`` (ms): a minted token's end (NULL: a login's, idle expiry only).
- ``idempotency_keys``: the first answer to a write under an ``Idempotency-Key``, per
  API key, with a hash of the body, kept 24 h.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def _run(ddl: str) -> None:
    for statement in ddl.split(";\n"):
        if statement.strip():
            op.execute(statement)


def upgrade() -> None:
    _run(
        """
CREATE TABLE api_keys (
    key_id      BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    key_hash    BYTEA NOT NULL UNIQUE,
    scopes      TEXT[] NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT,
    last_used_at BIGINT
);
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_at IS NULL;
ALTER TABLE users
    ADD COLUMN external_id TEXT,
    ADD COLUMN kind TEXT NOT NULL DEFAULT 'user',
    ADD COLUMN tokens_valid_after BIGINT;
CREATE UNIQUE INDEX users_external_id_live ON users (external_id)
    WHERE external_id IS NOT NULL AND deleted_at IS NULL;
CREATE INDEX users_external_id_any ON users (external_id) WHERE external_id IS NOT NULL;
ALTER TABLE sessions ADD COLUMN expires_at BIGINT;
CREATE TABLE idempotency_keys (
    key_id      BIGINT NOT NULL,
    idem_key    TEXT NOT NULL,
    body_hash   BYTEA NOT NULL,
    status      INT,
    answer      BYTEA,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (key_id, idem_key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
"""
    )


def downgrade() -> None:
    _run(
        """
DROP TABLE IF EXISTS idempotency_keys;
ALTER TABLE sessions DROP COLUMN IF EXISTS expires_at;
DROP INDEX IF EXISTS users_external_id_live;
DROP INDEX IF EXISTS users_external_id_any;
ALTER TABLE users DROP COLUMN IF EXISTS tokens_valid_after, DROP COLUMN IF EXISTS kind,
    DROP COLUMN IF EXISTS external_id;
DROP TABLE IF EXISTS api_keys;
"""
    )
