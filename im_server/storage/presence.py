"""Who may see whose presence: friends on both sides, neither having removed nor blocked
the other (a symmetric rule, so the users told of my changes are exactly those allowed
to ask for my presence)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_PEERS = (
    "SELECT p.peer FROM ("
    " SELECT user_b AS peer FROM friendships WHERE user_a = :u"
    " UNION ALL SELECT user_a FROM friendships WHERE user_b = :u"
    ") p "
    "WHERE NOT EXISTS (SELECT 1 FROM contact_states cs WHERE cs.removed AND ("
    " (cs.user_id = :u AND cs.peer_id = p.peer) OR (cs.user_id = p.peer AND cs.peer_id = :u))) "
    "AND NOT EXISTS (SELECT 1 FROM blocks b WHERE"
    " (b.user_id = :u AND b.blocked_id = p.peer) OR (b.user_id = p.peer AND b.blocked_id = :u))"
)


async def presence_peers(
    conn: AsyncConnection, user_id: int, among: list[int] | None = None
) -> list[int]:
    """The users who see ``user_id``'s presence (and whose presence it sees); with
    ``among``, only those of them."""
    if among is None:
        r = await conn.execute(text(_PEERS), {"u": user_id})
    else:
        r = await conn.execute(
            text(_PEERS + " AND p.peer = ANY(CAST(:among AS bigint[]))"),
            {"u": user_id, "among": among},
        )
    return [int(x) for x in r.scalars()]
