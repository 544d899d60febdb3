"""Users of the app's own ids (``users.external_id``).

Such a user's username is ``@`` + the external id, and so is its key: no registered
username can hold ``@`` (see ``names.py``), so the two never collide, and the external id
keeps its case. The password hash is empty: no password matches it. A deleted user
keeps its external id (the username is freed as for any deletion); only live users are
unique by it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

DISPLAY_NAME_MAX = 64


@dataclass(slots=True, frozen=True)
class AppUser:
    user_id: int
    external_id: str
    display_name: str
    kind: str


@dataclass(slots=True, frozen=True)
class Upserted:
    external_id: str
    user_id: int
    created: bool


async def upsert_many(
    conn: AsyncConnection,
    external_ids: list[str],
    display_names: list[str | None],
    kinds: list[str | None],
    now: int,
) -> list[Upserted]:
    """Create the users not there yet, update the given display names and kinds of the
    others; in the order given (the ids are distinct). Three statements, whatever the
    count: an insert of the new ones, an update of the rest, a read of every id."""
    r = await conn.execute(
        text(
            "INSERT INTO users (username, username_key, display_name, password_hash, "
            "created_at, external_id, kind) "
            "SELECT '@' || e, '@' || e, COALESCE(d, left(e, :m)), '', :t, e, COALESCE(k, 'user') "
            "FROM unnest(CAST(:e AS text[]), CAST(:d AS text[]), CAST(:k AS text[])) AS v(e, d, k) "
            "ON CONFLICT (external_id) WHERE external_id IS NOT NULL AND deleted_at IS NULL "
            "DO NOTHING "
            "RETURNING external_id"
        ),
        {"e": external_ids, "d": display_names, "k": kinds, "t": now, "m": DISPLAY_NAME_MAX},
    )
    created = {str(x) for x in r.scalars()}
    if len(created) < len(external_ids) and (
        any(d is not None for d in display_names) or any(k is not None for k in kinds)
    ):
        await conn.execute(
            text(
                "UPDATE users u SET display_name = COALESCE(v.d, u.display_name), "
                "kind = COALESCE(v.k, u.kind) "
                "FROM unnest(CAST(:e AS text[]), CAST(:d AS text[]), CAST(:k AS text[])) "
                "AS v(e, d, k) "
                "WHERE u.external_id = v.e AND u.deleted_at IS NULL "
                "AND (v.d IS NOT NULL OR v.k IS NOT NULL) "
                "AND NOT (v.e = ANY(CAST(:c AS text[])))"
            ),
            {"e": external_ids, "d": display_names, "k": kinds, "c": sorted(created)},
        )
    r = await conn.execute(
        text(
            "SELECT external_id, user_id FROM users "
            "WHERE external_id = ANY(CAST(:e AS text[])) AND deleted_at IS NULL"
        ),
        {"e": external_ids},
    )
    ids = {str(e): int(u) for e, u in r}
    return [Upserted(e, ids[e], e in created) for e in external_ids]


async def by_external_id(conn: AsyncConnection, external_id: str) -> AppUser | None:
    r = await conn.execute(
        text(
            "SELECT user_id, external_id, display_name, kind FROM users "
            "WHERE external_id = :e AND deleted_at IS NULL"
        ),
        {"e": external_id},
    )
    row = r.first()
    return AppUser(int(row[0]), str(row[1]), str(row[2]), str(row[3])) if row else None


@dataclass(slots=True, frozen=True)
class TokenOwner:
    user_id: int
    tokens_valid_after: int | None  # ms; None: never revoked
    deleted_at: int | None  # ms; set: the newest user of that id is deleted


async def token_owner(conn: AsyncConnection, external_id: str) -> TokenOwner | None:
    """Who an app-signed token of that id speaks for: the live user, else the newest
    deleted one (whose deletion time refuses the tokens issued before it)."""
    r = await conn.execute(
        text(
            "SELECT user_id, tokens_valid_after, deleted_at FROM users WHERE external_id = :e "
            "ORDER BY deleted_at IS NULL DESC, deleted_at DESC LIMIT 1"
        ),
        {"e": external_id},
    )
    row = r.first()
    return TokenOwner(int(row[0]), row[1], row[2]) if row else None


async def user_ids_of(conn: AsyncConnection, external_ids: list[str]) -> dict[str, int]:
    r = await conn.execute(
        text(
            "SELECT external_id, user_id FROM users "
            "WHERE external_id = ANY(CAST(:e AS text[])) AND deleted_at IS NULL"
        ),
        {"e": external_ids},
    )
    return {str(e): int(u) for e, u in r}


async def kind_of(conn: AsyncConnection, user_id: int) -> str | None:
    """The live user's kind (``user`` or ``bot``); None when there is no such user."""
    r = await conn.execute(
        text("SELECT kind FROM users WHERE user_id = :u AND deleted_at IS NULL"), {"u": user_id}
    )
    row = r.first()
    return str(row[0]) if row else None


async def set_tokens_valid_after(conn: AsyncConnection, user_id: int, now: int) -> None:
    await conn.execute(
        text("UPDATE users SET tokens_valid_after = :t WHERE user_id = :u"),
        {"u": user_id, "t": now},
    )


async def token_floors(conn: AsyncConnection, user_ids: list[int]) -> dict[int, int | None]:
    """Each live user's ``tokens_valid_after`` (None: never revoked); a deleted or
    unknown user is left out."""
    r = await conn.execute(
        text(
            "SELECT user_id, tokens_valid_after FROM users "
            "WHERE user_id = ANY(:u) AND deleted_at IS NULL"
        ),
        {"u": user_ids},
    )
    return {int(u): (int(t) if t is not None else None) for u, t in r}


async def external_id_of(conn: AsyncConnection, user_id: int) -> str | None:
    r = await conn.execute(text("SELECT external_id FROM users WHERE user_id = :u"), {"u": user_id})
    row = r.first()
    return str(row[0]) if row and row[0] is not None else None
