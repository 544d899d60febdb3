"""Uploads (see migration 0011): what the server records of each object, the access rule
as one statement, the thumbnail worker's leased rows, and the clean-up of uploads never
sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

MAX_SEQ = 9223372036854775807


@dataclass(frozen=True, slots=True)
class Upload:
    upload_id: str
    owner_id: int
    content_type: str
    size: int
    filename: str | None
    width: int | None
    height: int | None
    thumb_state: str  # none | pending | done | failed
    thumb_type: str | None
    sealed: bool  # the checked copy exists (``s/<id>``); else the bytes are at ``u/<id>``


_COLUMNS = (
    "u.upload_id, u.owner_id, u.content_type, u.size, u.filename, u.width, u.height, "
    "u.thumb_state, u.thumb_type, u.sealed_at IS NOT NULL"
)


def _upload(r: Sequence[object]) -> Upload:
    return Upload(
        str(r[0]),
        int(r[1]),  # type: ignore[call-overload]
        str(r[2]),
        int(r[3]),  # type: ignore[call-overload]
        None if r[4] is None else str(r[4]),
        None if r[5] is None else int(r[5]),  # type: ignore[call-overload]
        None if r[6] is None else int(r[6]),  # type: ignore[call-overload]
        str(r[7]),
        None if r[8] is None else str(r[8]),
        bool(r[9]),
    )


async def add(
    conn: AsyncConnection,
    upload_id: str,
    owner_id: int,
    content_type: str,
    size: int,
    filename: str | None,
    now: int,
) -> None:
    await conn.execute(
        text(
            "INSERT INTO uploads (upload_id, owner_id, content_type, size, filename, created_at) "
            "VALUES (:i, :o, :t, :s, :f, :n)"
        ),
        {"i": upload_id, "o": owner_id, "t": content_type, "s": size, "f": filename, "n": now},
    )


async def claim(conn: AsyncConnection, upload_id: str, owner_id: int, now: int) -> Upload | None:
    """A send of ``owner_id`` is about to carry the upload: note when (the clean-up
    spares it from now on, and waits for this transaction) and answer the row, locked
    until the caller's transaction ends (two sends sealing one upload take turns); None
    when there is no such upload of that owner."""
    r = await conn.execute(
        text(
            "UPDATE uploads u SET claimed_at = :n WHERE u.upload_id = :i AND u.owner_id = :o "
            f"RETURNING {_COLUMNS}"
        ),
        {"i": upload_id, "o": owner_id, "n": now},
    )
    row = r.first()
    return None if row is None else _upload(row)


async def seal(conn: AsyncConnection, upload_id: str, now: int) -> None:
    """The checked copy of the upload's bytes exists: read it from now on."""
    await conn.execute(
        text("UPDATE uploads SET sealed_at = :n WHERE upload_id = :i AND sealed_at IS NULL"),
        {"i": upload_id, "n": now},
    )


async def set_image(
    conn: AsyncConnection, upload_id: str, width: int, height: int, mime: str
) -> None:
    """An image's dimensions and its media type, read from its sealed bytes when it was
    first sent as an image, and its thumbnail queued once."""
    await conn.execute(
        text(
            "UPDATE uploads SET width = :w, height = :h, content_type = :t, "
            "  thumb_state = CASE WHEN thumb_state = 'none' THEN 'pending' ELSE thumb_state END "
            "WHERE upload_id = :i"
        ),
        {"i": upload_id, "w": width, "h": height, "t": mime},
    )


# The uploader, or a member whose window holds a stored, non-recalled message carrying
# the upload (primary keys all the way: message_uploads by upload_id, then messages,
# conversations and conv_members by their keys).
_VISIBLE = f"""
    SELECT {_COLUMNS} FROM uploads u
     WHERE u.upload_id = :i
       AND (u.owner_id = :me OR EXISTS (
            SELECT 1 FROM message_uploads mu
              JOIN messages x ON x.conv_id = mu.conv_id AND x.seq = mu.seq
              JOIN conversations c ON c.conv_id = mu.conv_id
              JOIN conv_members m ON m.conv_id = mu.conv_id AND m.user_id = :me
             WHERE mu.upload_id = u.upload_id AND NOT x.recalled
               AND mu.seq >= GREATEST(c.min_seq, m.min_seq)
               AND mu.seq <= COALESCE(m.max_seq, {MAX_SEQ})))
"""


async def visible(conn: AsyncConnection, upload_id: str, user_id: int) -> Upload | None:
    """The upload if ``user_id`` may fetch it, else None (absent and forbidden alike)."""
    row = (await conn.execute(text(_VISIBLE), {"i": upload_id, "me": user_id})).first()
    return None if row is None else _upload(row)


async def claim_thumbnails(
    conn: AsyncConnection, now: int, lease_ms: int, limit: int
) -> list[Upload]:
    """Lease up to ``limit`` pending thumbnails (``SKIP LOCKED`` and the lease keep two
    workers off one row)."""
    r = await conn.execute(
        text(
            "UPDATE uploads u SET thumb_lease_until = :l, thumb_attempts = u.thumb_attempts + 1 "
            "FROM (SELECT upload_id FROM uploads "
            "      WHERE thumb_state = 'pending' AND thumb_lease_until < :n "
            "      ORDER BY thumb_lease_until LIMIT :k FOR UPDATE SKIP LOCKED) AS t "
            f"WHERE u.upload_id = t.upload_id RETURNING {_COLUMNS}"
        ),
        {"n": now, "l": now + lease_ms, "k": limit},
    )
    return [_upload(row) for row in r]


async def finish_thumbnail(
    conn: AsyncConnection, upload_id: str, state: str, thumb_type: str | None
) -> None:
    await conn.execute(
        text(
            "UPDATE uploads SET thumb_state = :s, thumb_type = :t, thumb_lease_until = 0 "
            "WHERE upload_id = :i"
        ),
        {"i": upload_id, "s": state, "t": thumb_type},
    )


async def lock_raw_due(conn: AsyncConnection, cutoff: int, limit: int) -> list[str]:
    """Sealed uploads whose client key was not deleted yet, sealed before ``cutoff``
    (their presigned URL has expired by then), locked for this transaction."""
    r = await conn.execute(
        text(
            "SELECT upload_id FROM uploads "
            "WHERE sealed_at IS NOT NULL AND raw_cleared_at IS NULL AND sealed_at < :c "
            "ORDER BY sealed_at LIMIT :k FOR UPDATE SKIP LOCKED"
        ),
        {"c": cutoff, "k": limit},
    )
    return [str(i) for i in r.scalars()]


async def raw_cleared(conn: AsyncConnection, upload_ids: Sequence[str], now: int) -> None:
    await conn.execute(
        text("UPDATE uploads SET raw_cleared_at = :n WHERE upload_id = ANY(CAST(:ids AS text[]))"),
        {"ids": list(upload_ids), "n": now},
    )


async def lock_unsent(conn: AsyncConnection, cutoff: int, limit: int) -> list[tuple[str, str]]:
    """Uploads no stored message carries, made and last claimed before ``cutoff``, locked
    for this transaction (a send claiming one meanwhile waits for it, then finds it
    gone): (upload_id, thumb_state)."""
    r = await conn.execute(
        text(
            "SELECT upload_id, thumb_state FROM uploads "
            "WHERE sent_at IS NULL AND created_at < :c AND COALESCE(claimed_at, 0) < :c "
            "ORDER BY created_at LIMIT :k FOR UPDATE SKIP LOCKED"
        ),
        {"c": cutoff, "k": limit},
    )
    return [(str(i), str(t)) for i, t in r]


async def delete(conn: AsyncConnection, upload_ids: Sequence[str]) -> None:
    if upload_ids:
        await conn.execute(
            text("DELETE FROM uploads WHERE upload_id = ANY(CAST(:ids AS text[]))"),
            {"ids": list(upload_ids)},
        )
