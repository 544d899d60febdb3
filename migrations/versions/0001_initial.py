"""Initial schema: accounts, contacts, groups, conversations, members, messages.

Every table that grows with traffic is keyed by conv_id first, so it can be
hash-partitioned or distributed by it.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DDL = """
CREATE TABLE users (
    user_id       BIGSERIAL PRIMARY KEY,
    username      TEXT NOT NULL UNIQUE,
    display_name  TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);

CREATE TABLE sessions (
    token_hash  BYTEA PRIMARY KEY,
    user_id     BIGINT NOT NULL REFERENCES users(user_id),
    device_id   TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX sessions_user ON sessions (user_id);

CREATE TABLE friend_requests (
    request_id    BIGSERIAL PRIMARY KEY,
    from_user_id  BIGINT NOT NULL REFERENCES users(user_id),
    to_user_id    BIGINT NOT NULL REFERENCES users(user_id),
    note          TEXT NOT NULL DEFAULT '',
    status        SMALLINT NOT NULL DEFAULT 0,   -- 0 pending, 1 accepted
    created_at    BIGINT NOT NULL
);
CREATE UNIQUE INDEX friend_requests_pending ON friend_requests (from_user_id, to_user_id) WHERE status = 0;
CREATE INDEX friend_requests_to ON friend_requests (to_user_id) WHERE status = 0;

-- one row per pair (user_a < user_b), never deleted
CREATE TABLE friendships (
    user_a      BIGINT NOT NULL REFERENCES users(user_id),
    user_b      BIGINT NOT NULL REFERENCES users(user_id),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (user_a, user_b),
    CHECK (user_a < user_b)
);

-- what only one side did: removed the other
CREATE TABLE contact_states (
    user_id  BIGINT NOT NULL,
    peer_id  BIGINT NOT NULL,
    removed  BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (user_id, peer_id)
);

-- user_id blocked blocked_id: blocked_id cannot send to user_id
CREATE TABLE blocks (
    user_id     BIGINT NOT NULL,
    blocked_id  BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (user_id, blocked_id)
);

CREATE TABLE groups (
    group_id    BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    owner_id    BIGINT NOT NULL REFERENCES users(user_id),
    created_at  BIGINT NOT NULL
);

CREATE TABLE conversations (
    conv_id       TEXT PRIMARY KEY,
    conv_type     SMALLINT NOT NULL,              -- 1 single, 2 group
    group_id      BIGINT,
    min_seq       BIGINT NOT NULL DEFAULT 1,      -- conversation-wide lower bound
    max_seq       BIGINT NOT NULL DEFAULT 0,      -- highest persisted seq
    seq_reserved  BIGINT NOT NULL DEFAULT 0,      -- high-water mark of seqs handed to Redis
    version       BIGINT NOT NULL DEFAULT 0,      -- sync version of the last persisted change
    created_at    BIGINT NOT NULL
);

-- a member's own view of a conversation: its window, cursors, role
CREATE TABLE conv_members (
    conv_id        TEXT NOT NULL,
    user_id        BIGINT NOT NULL,
    role           SMALLINT NOT NULL DEFAULT 0,   -- 0 member, 1 admin, 2 owner
    min_seq        BIGINT NOT NULL DEFAULT 1,     -- my window's lower bound (clear, join)
    max_seq        BIGINT,                        -- my window's upper bound (kick, leave); NULL = open
    read_seq       BIGINT,                        -- NULL until I report one
    delivered_seq  BIGINT NOT NULL DEFAULT 0,
    hidden_seq     BIGINT,                        -- hidden while conversations.max_seq <= hidden_seq
    version        BIGINT NOT NULL DEFAULT 0,     -- sync version of my last own change
    joined_at      BIGINT NOT NULL,
    PRIMARY KEY (conv_id, user_id)
);
CREATE INDEX conv_members_user ON conv_members (user_id, conv_id);
CREATE INDEX conv_members_read ON conv_members (conv_id, read_seq);

CREATE TABLE messages (
    conv_id        TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    sender_id      BIGINT NOT NULL,
    client_msg_id  TEXT NOT NULL,
    content_type   TEXT NOT NULL,
    content        JSONB,
    server_time    BIGINT NOT NULL,
    recalled       BOOLEAN NOT NULL DEFAULT FALSE,
    CONSTRAINT messages_pkey PRIMARY KEY (conv_id, seq) INCLUDE (sender_id, content_type)
);
-- the last guard of dedupe, across Redis restarts
CREATE UNIQUE INDEX messages_dedupe ON messages (sender_id, client_msg_id);
-- the unread fallback: my last sent seq in a conversation
CREATE INDEX messages_sender ON messages (conv_id, sender_id, seq);

-- one row: the sync version; taken with a row lock inside each writing transaction so
-- versions commit in order (a reader never sees version N before every version < N)
CREATE TABLE sync_version (
    id       SMALLINT PRIMARY KEY,
    version  BIGINT NOT NULL
);
INSERT INTO sync_version VALUES (1, 0);
"""


def upgrade() -> None:
    for statement in DDL.split(";\n"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute(
        "DROP TABLE IF EXISTS sync_version, messages, conv_members, conversations, groups, "
        "blocks, contact_states, friendships, friend_requests, sessions, users CASCADE"
    )
