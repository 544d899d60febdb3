"""Friend requests, friendships (one row per pair, never deleted), one-sided contact
state (removed), one-way blocks, and the send-permission lookup of single chats."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from im_server.storage.db import now_ms


@dataclass(slots=True)
class FriendRequest:
    request_id: int
    from_user_id: int
    to_user_id: int
    note: str
    status: int
    created_at: int

    def public(self) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "from_user_id": self.from_user_id,
            "to_user_id": self.to_user_id,
            "note": self.note,
            "created_at": self.created_at,
        }


_REQ_COLS = "request_id, from_user_id, to_user_id, note, status, created_at"


async def pending_request(conn: AsyncConnection, from_id: int, to_id: int) -> FriendRequest | None:
    r = await conn.execute(
        text(
            f"SELECT {_REQ_COLS} FROM friend_requests WHERE from_user_id = :f AND to_user_id = :t AND status = 0"
        ),
        {"f": from_id, "t": to_id},
    )
    row = r.first()
    return FriendRequest(*row) if row else None


async def request_by_id(
    conn: AsyncConnection, request_id: int, *, for_update: bool = False
) -> FriendRequest | None:
    sql = f"SELECT {_REQ_COLS} FROM friend_requests WHERE request_id = :r"
    if for_update:
        sql += " FOR UPDATE"
    row = (await conn.execute(text(sql), {"r": request_id})).first()
    return FriendRequest(*row) if row else None


async def create_request(conn: AsyncConnection, from_id: int, to_id: int, note: str) -> int:
    r = await conn.execute(
        text(
            "INSERT INTO friend_requests (from_user_id, to_user_id, note, created_at) "
            "VALUES (:f, :t, :n, :c) ON CONFLICT (from_user_id, to_user_id) WHERE status = 0 "
            "DO UPDATE SET note = EXCLUDED.note RETURNING request_id"
        ),
        {"f": from_id, "t": to_id, "n": note, "c": now_ms()},
    )
    return int(r.scalar_one())


async def mark_accepted(conn: AsyncConnection, request_ids: list[int]) -> None:
    await conn.execute(
        text("UPDATE friend_requests SET status = 1 WHERE request_id = ANY(:r)"), {"r": request_ids}
    )


# friend_requests.status: 0 pending, 1 accepted, 2 declined, 3 cancelled (by its sender)
DECLINED = 2
CANCELLED = 3


async def close_request(conn: AsyncConnection, request_id: int, status: int) -> None:
    """A pending request declined or cancelled: it leaves both sides' lists."""
    await conn.execute(
        text("UPDATE friend_requests SET status = :s WHERE request_id = :r AND status = 0"),
        {"s": status, "r": request_id},
    )


async def decline_from(conn: AsyncConnection, to_id: int, from_id: int) -> None:
    """Decline the pending request of ``from_id`` to ``to_id``, if there is one."""
    await conn.execute(
        text(
            "UPDATE friend_requests SET status = 2 "
            "WHERE from_user_id = :f AND to_user_id = :t AND status = 0"
        ),
        {"f": from_id, "t": to_id},
    )


async def pending_for(
    conn: AsyncConnection, user_id: int
) -> tuple[list[FriendRequest], list[FriendRequest]]:
    r = await conn.execute(
        text(
            f"SELECT {_REQ_COLS} FROM friend_requests WHERE status = 0 AND (to_user_id = :u OR from_user_id = :u) "
            "ORDER BY request_id"
        ),
        {"u": user_id},
    )
    incoming: list[FriendRequest] = []
    outgoing: list[FriendRequest] = []
    for row in r:
        fr = FriendRequest(*row)
        (incoming if fr.to_user_id == user_id else outgoing).append(fr)
    return incoming, outgoing


async def make_friends(conn: AsyncConnection, u1: int, u2: int) -> None:
    """Create the pair's row if missing and clear 'removed' on both sides (keeping any
    clear point, which lives in the conversation window)."""
    a, b = sorted((u1, u2))
    await conn.execute(
        text(
            "INSERT INTO friendships (user_a, user_b, created_at) VALUES (:a, :b, :t) ON CONFLICT DO NOTHING"
        ),
        {"a": a, "b": b, "t": now_ms()},
    )
    await conn.execute(
        text(
            "INSERT INTO contact_states (user_id, peer_id, removed) VALUES (:a, :b, false), (:b, :a, false) "
            "ON CONFLICT (user_id, peer_id) DO UPDATE SET removed = false"
        ),
        {"a": a, "b": b},
    )


async def are_friends(conn: AsyncConnection, u1: int, u2: int) -> bool:
    """Friends with neither side having removed the other."""
    a, b = sorted((u1, u2))
    r = await conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM friendships WHERE user_a = :a AND user_b = :b) AND NOT EXISTS "
            "(SELECT 1 FROM contact_states WHERE ((user_id = :a AND peer_id = :b) OR (user_id = :b AND peer_id = :a)) "
            "AND removed)"
        ),
        {"a": a, "b": b},
    )
    return bool(r.scalar_one())


async def set_removed(conn: AsyncConnection, user_id: int, peer_id: int) -> bool:
    """Mark peer removed on my side; False when we were never friends."""
    a, b = sorted((user_id, peer_id))
    r = await conn.execute(
        text("SELECT 1 FROM friendships WHERE user_a = :a AND user_b = :b"), {"a": a, "b": b}
    )
    if r.first() is None:
        return False
    await conn.execute(
        text(
            "INSERT INTO contact_states (user_id, peer_id, removed) VALUES (:u, :p, true) "
            "ON CONFLICT (user_id, peer_id) DO UPDATE SET removed = true"
        ),
        {"u": user_id, "p": peer_id},
    )
    return True


async def remove_every_friend(conn: AsyncConnection, user_id: int) -> list[int]:
    """Mark every friend removed on the user's side (a deleted account: single-chat sends
    to it are refused ``not_friends``); the friends' ids."""
    r = await conn.execute(
        text(
            "INSERT INTO contact_states (user_id, peer_id, removed) "
            "SELECT :u, CASE WHEN user_a = :u THEN user_b ELSE user_a END, true "
            "FROM friendships WHERE user_a = :u OR user_b = :u "
            "ON CONFLICT (user_id, peer_id) DO UPDATE SET removed = true "
            "RETURNING peer_id"
        ),
        {"u": user_id},
    )
    return sorted(int(p) for p in r.scalars())


async def drop_pending_requests(conn: AsyncConnection, user_id: int) -> list[int]:
    """Delete the pending friend requests from and to the user; the other sides' ids."""
    r = await conn.execute(
        text(
            "DELETE FROM friend_requests WHERE status = 0 "
            "AND (from_user_id = :u OR to_user_id = :u) "
            "RETURNING CASE WHEN from_user_id = :u THEN to_user_id ELSE from_user_id END"
        ),
        {"u": user_id},
    )
    return sorted({int(p) for p in r.scalars()})


async def friends_of(conn: AsyncConnection, user_id: int) -> list[tuple[int, str]]:
    """My friends, without those I removed (the other side's removal does not hide them)
    and without deleted accounts."""
    r = await conn.execute(
        text(
            "SELECT u.user_id, u.username FROM friendships f "
            "JOIN users u ON u.user_id = CASE WHEN f.user_a = :u THEN f.user_b ELSE f.user_a END "
            "LEFT JOIN contact_states cs ON cs.user_id = :u AND cs.peer_id = u.user_id "
            "WHERE (f.user_a = :u OR f.user_b = :u) AND NOT COALESCE(cs.removed, false) "
            "AND u.deleted_at IS NULL "
            "ORDER BY u.user_id"
        ),
        {"u": user_id},
    )
    return [(int(a), str(b)) for a, b in r]


async def add_block(conn: AsyncConnection, user_id: int, blocked_id: int) -> None:
    await conn.execute(
        text(
            "INSERT INTO blocks (user_id, blocked_id, created_at) VALUES (:u, :b, :t) ON CONFLICT DO NOTHING"
        ),
        {"u": user_id, "b": blocked_id, "t": now_ms()},
    )


async def remove_block(conn: AsyncConnection, user_id: int, blocked_id: int) -> None:
    await conn.execute(
        text("DELETE FROM blocks WHERE user_id = :u AND blocked_id = :b"),
        {"u": user_id, "b": blocked_id},
    )


async def blocked_by(conn: AsyncConnection, user_id: int, others: list[int]) -> list[int]:
    """Which of ``others`` have blocked ``user_id``."""
    r = await conn.execute(
        text(
            "SELECT user_id FROM blocks WHERE user_id = ANY(CAST(:o AS bigint[])) "
            "AND blocked_id = :u ORDER BY user_id"
        ),
        {"u": user_id, "o": others},
    )
    return [int(x) for x in r.scalars()]


async def blocks_of(conn: AsyncConnection, user_id: int) -> list[int]:
    r = await conn.execute(
        text("SELECT blocked_id FROM blocks WHERE user_id = :u ORDER BY blocked_id"), {"u": user_id}
    )
    return [int(x) for x in r.scalars()]


async def single_send_statuses(conn: AsyncConnection, a: int, b: int) -> dict[int, str]:
    """For the pair (a, b): may each side send to the other? 'ok', 'not_friends' or 'blocked'."""
    r = await conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM friendships WHERE user_a = :a AND user_b = :b), "
            "COALESCE((SELECT removed FROM contact_states WHERE user_id = :a AND peer_id = :b), false), "
            "COALESCE((SELECT removed FROM contact_states WHERE user_id = :b AND peer_id = :a), false), "
            "EXISTS (SELECT 1 FROM blocks WHERE user_id = :a AND blocked_id = :b), "
            "EXISTS (SELECT 1 FROM blocks WHERE user_id = :b AND blocked_id = :a)"
        ),
        {"a": a, "b": b},
    )
    friends, a_removed, b_removed, a_blocks_b, b_blocks_a = r.one()
    ok_pair = friends and not a_removed and not b_removed
    return {
        a: "not_friends" if not ok_pair else ("blocked" if b_blocks_a else "ok"),
        b: "not_friends" if not ok_pair else ("blocked" if a_blocks_b else "ok"),
    }


async def related(conn: AsyncConnection, a: int, b: int) -> bool:
    """Whether a and b share anything: a friendship (ever: the row is never deleted), a
    pending friend request either way, or a conversation (a group, joined now or before)."""
    lo, hi = min(a, b), max(a, b)
    r = await conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM friendships WHERE user_a = :lo AND user_b = :hi) "
            "OR EXISTS (SELECT 1 FROM friend_requests WHERE status = 0 AND "
            "((from_user_id = :a AND to_user_id = :b) OR (from_user_id = :b AND to_user_id = :a))) "
            "OR EXISTS (SELECT 1 FROM conv_members x JOIN conv_members y "
            "ON y.conv_id = x.conv_id AND y.user_id = :b WHERE x.user_id = :a)"
        ),
        {"a": a, "b": b, "lo": lo, "hi": hi},
    )
    return bool(r.scalar())
