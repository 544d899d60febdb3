"""Sessions users can manage, idle expiry, usernames unique after normalisation.

- ``sessions.last_used_at``: when the token was last used (written at most every
  ``IM_SESSION_TOUCH_SECONDS``); existing rows get their ``created_at``.
- One live session per (user, device): older live duplicates are revoked, then a partial
  unique index keeps it so.
- ``users.username_key``: NFKC + case fold + NFKC of the username, unique. Usernames
  so far were ASCII ``[A-Za-z0-9_.-]``, whose key is ``lower()``; any other row is
  keyed in Python. Rows whose key an older row already has ("Alice" after "alice") keep
  a key no username can have (``#<user_id>:<key>``), so the migration never fails on
  them and their owners still log in with their exact username.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import time
import unicodedata

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _key(username: str) -> str:
    # the rule of im_server.names.username_key, frozen here as it was when this ran
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", username).casefold())


def upgrade() -> None:
    now = int(time.time() * 1000)
    op.execute("ALTER TABLE sessions ADD COLUMN last_used_at BIGINT")
    op.execute("UPDATE sessions SET last_used_at = created_at")
    op.execute("ALTER TABLE sessions ALTER COLUMN last_used_at SET NOT NULL")
    op.execute(
        sa.text(
            "UPDATE sessions s SET revoked_at = :now FROM ("
            "  SELECT token_hash, row_number() OVER ("
            "    PARTITION BY user_id, device_id ORDER BY created_at DESC, token_hash DESC) AS n"
            "  FROM sessions WHERE revoked_at IS NULL"
            ") d WHERE s.token_hash = d.token_hash AND d.n > 1"
        ).bindparams(now=now)
    )
    op.execute(
        "CREATE UNIQUE INDEX sessions_live_device ON sessions (user_id, device_id) "
        "WHERE revoked_at IS NULL"
    )

    op.execute("ALTER TABLE users ADD COLUMN username_key TEXT")
    op.execute(
        "UPDATE users SET username_key = lower(username) WHERE username ~ '^[A-Za-z0-9_.-]*$'"
    )
    bind = op.get_bind()
    others = bind.execute(
        sa.text("SELECT user_id, username FROM users WHERE username_key IS NULL")
    ).all()
    for user_id, username in others:
        bind.execute(
            sa.text("UPDATE users SET username_key = :k WHERE user_id = :u"),
            {"k": _key(username), "u": user_id},
        )
    op.execute(
        "UPDATE users u SET username_key = '#' || u.user_id || ':' || u.username_key FROM ("
        "  SELECT user_id, row_number() OVER (PARTITION BY username_key ORDER BY user_id) AS n"
        "  FROM users"
        ") d WHERE u.user_id = d.user_id AND d.n > 1"
    )
    op.execute("ALTER TABLE users ALTER COLUMN username_key SET NOT NULL")
    op.execute("CREATE UNIQUE INDEX users_username_key_unique ON users (username_key)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS users_username_key_unique")
    op.execute("ALTER TABLE users DROP COLUMN IF EXISTS username_key")
    op.execute("DROP INDEX IF EXISTS sessions_live_device")
    op.execute("ALTER TABLE sessions DROP COLUMN IF EXISTS last_used_at")
