"""Webhooks and the outbox of their deliveries (see migration 0018).

A delivery is sent only when it is the oldest pending row of its (webhook, conv_key):
its queue's head. A process claims heads by setting ``lease_until``; a head whose lease
ran out (its process died) is claimed again. Message events are written by the
persister's statement (``storage/messages.py``); user events here, in the caller's
transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

PENDING, DELIVERED, FAILED = 0, 1, 2


@dataclass(slots=True, frozen=True)
class Webhook:
    webhook_id: int
    url: str
    events: tuple[str, ...]
    created_at: int


@dataclass(slots=True, frozen=True)
class Signing:
    url: str
    secrets: tuple[str, ...]  # the current one first; the previous one while it still signs


@dataclass(slots=True, frozen=True)
class Delivery:
    delivery_id: int
    webhook_id: int
    event_key: str
    conv_key: str
    type: str
    data: Any
    created_at: int
    attempts: int


_DELIVERY_COLS = "delivery_id, webhook_id, event_key, conv_key, type, data, created_at, attempts"


def _delivery(r: Any) -> Delivery:
    return Delivery(int(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4]), r[5], int(r[6]), r[7])


async def create(conn: AsyncConnection, url: str, events: list[str], secret: str, now: int) -> int:
    r = await conn.execute(
        text(
            "INSERT INTO webhooks (url, events, secret, created_at) VALUES (:u, :e, :s, :t) "
            "RETURNING webhook_id"
        ),
        {"u": url, "e": events, "s": secret, "t": now},
    )
    return int(r.scalar_one())


async def live(conn: AsyncConnection) -> list[Webhook]:
    r = await conn.execute(
        text(
            "SELECT webhook_id, url, events, created_at FROM webhooks "
            "WHERE deleted_at IS NULL ORDER BY webhook_id"
        )
    )
    return [Webhook(int(a), str(b), tuple(c), int(d)) for a, b, c, d in r]


async def delete(conn: AsyncConnection, webhook_id: int, now: int) -> bool:
    """Delete the webhook; its pending deliveries go with it (nobody takes them now)."""
    r = await conn.execute(
        text(
            "UPDATE webhooks SET deleted_at = :t WHERE webhook_id = :w AND deleted_at IS NULL "
            "RETURNING webhook_id"
        ),
        {"w": webhook_id, "t": now},
    )
    if r.first() is None:
        return False
    await conn.execute(
        text("DELETE FROM webhook_outbox WHERE webhook_id = :w AND status = 0"), {"w": webhook_id}
    )
    return True


async def rotate(conn: AsyncConnection, webhook_id: int, secret: str, old_until: int) -> bool:
    r = await conn.execute(
        text(
            "UPDATE webhooks SET old_secret = secret, old_secret_until = :o, secret = :s "
            "WHERE webhook_id = :w AND deleted_at IS NULL RETURNING webhook_id"
        ),
        {"w": webhook_id, "s": secret, "o": old_until},
    )
    return r.first() is not None


async def exists(conn: AsyncConnection, webhook_id: int) -> bool:
    r = await conn.execute(
        text("SELECT 1 FROM webhooks WHERE webhook_id = :w AND deleted_at IS NULL"),
        {"w": webhook_id},
    )
    return r.first() is not None


async def signing(conn: AsyncConnection, webhook_ids: list[int], now: int) -> dict[int, Signing]:
    """Where each live webhook's deliveries go and the secrets that sign them now."""
    r = await conn.execute(
        text(
            "SELECT webhook_id, url, secret, old_secret, old_secret_until FROM webhooks "
            "WHERE webhook_id = ANY(:w) AND deleted_at IS NULL"
        ),
        {"w": webhook_ids},
    )
    out: dict[int, Signing] = {}
    for wid, url, secret, old, until in r:
        keys = (secret, old) if old and until and until > now else (secret,)
        out[int(wid)] = Signing(str(url), keys)
    return out


# ---- events of users --------------------------------------------------------------------------


async def user_events(conn: AsyncConnection, user_ids: list[int], type_: str, now: int) -> int:
    """``user.created`` / ``user.deleted`` of these users for every webhook taking it, in
    the caller's transaction (the one that made or deleted them)."""
    if not user_ids:
        return 0
    r = await conn.execute(
        text(
            "INSERT INTO webhook_outbox (webhook_id, event_key, conv_key, type, data, "
            "created_at, next_at) "
            "SELECT w.webhook_id, 'user_' || u.user_id || '_' || :suffix, 'user:' || u.user_id, "
            ":t, jsonb_strip_nulls(jsonb_build_object('user_id', u.user_id, "
            "'external_id', u.external_id, 'kind', u.kind, "
            "'display_name', NULLIF(u.display_name, ''))), :now, :now "
            "FROM users u JOIN webhooks w ON w.deleted_at IS NULL "
            "AND w.events && ARRAY['*', CAST(:t AS text)] "
            "WHERE u.user_id = ANY(:ids) ORDER BY u.user_id "
            "ON CONFLICT DO NOTHING"
        ),
        {"ids": user_ids, "t": type_, "suffix": type_.split(".")[1], "now": now},
    )
    return int(r.rowcount or 0)


async def group_created_event(
    conn: AsyncConnection, conv_id: str, owner: int, user_ids: list[int], now: int
) -> int:
    """``member.added`` of a new group's first members (its owner among them) for every
    webhook taking it, in the transaction that makes the group. A group is made without
    a notice in its seq stream (its first message keeps seq 1), so this event, keyed
    ``group_<conv_id>_created`` and queued in the conversation's order, is how a
    receiver that mirrors memberships hears of them: it has the fields of a
    ``members_added`` notice's event, without a seq (and no ``client_msg_id``)."""
    r = await conn.execute(
        text(
            "INSERT INTO webhook_outbox (webhook_id, event_key, conv_key, type, data, "
            "created_at, next_at) "
            "SELECT w.webhook_id, 'group_' || CAST(:c AS text) || '_created', :c, 'member.added', "
            "jsonb_build_object('conv_id', CAST(:c AS text), 'sender_id', CAST(:o AS bigint), "
            "'content_type', 'system', 'content', jsonb_build_object("
            "'event', 'members_added', 'actor', CAST(:o AS bigint), "
            "'user_ids', to_jsonb(CAST(:ids AS bigint[])), 'with_history', true), "
            "'server_time', CAST(:now AS bigint), 'recalled', false, 'client_msg_id', NULL, "
            "'mentions', '[]'::jsonb, 'mention_all', false, 'reply_to', NULL, 'edited_at', NULL, "
            "'reactions', '[]'::jsonb) "
            "|| jsonb_strip_nulls(jsonb_build_object('external_id', "
            "(SELECT u.external_id FROM users u WHERE u.user_id = :o))), :now, :now "
            "FROM webhooks w WHERE w.deleted_at IS NULL "
            "AND w.events && ARRAY['*', 'member.added'] ORDER BY w.webhook_id "
            "ON CONFLICT DO NOTHING"
        ),
        {"c": conv_id, "o": owner, "ids": sorted(user_ids), "now": now},
    )
    return int(r.rowcount or 0)


# ---- delivering ------------------------------------------------------------------------------


async def claim_heads(
    conn: AsyncConnection, now: int, lease_until: int, limit: int
) -> list[Delivery]:
    """Claim up to ``limit`` queue heads that are due and not leased."""
    r = await conn.execute(
        text(
            "WITH heads AS ("
            "  SELECT DISTINCT ON (webhook_id, conv_key) delivery_id, next_at, lease_until"
            "    FROM webhook_outbox WHERE status = 0"
            "   ORDER BY webhook_id, conv_key, delivery_id"
            "), due AS ("
            "  SELECT o.delivery_id FROM webhook_outbox o JOIN heads h USING (delivery_id)"
            "   WHERE h.next_at <= :now AND (h.lease_until IS NULL OR h.lease_until < :now)"
            "   ORDER BY o.next_at LIMIT :n FOR UPDATE OF o SKIP LOCKED"
            ") UPDATE webhook_outbox o SET lease_until = :l FROM due "
            f"WHERE o.delivery_id = due.delivery_id RETURNING {_prefixed('o')}"
        ),
        {"now": now, "l": lease_until, "n": limit},
    )
    return [_delivery(x) for x in r]


def _prefixed(alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in _DELIVERY_COLS.split(","))


async def delivered_then_next(
    conn: AsyncConnection, d: Delivery, now: int, lease_until: int
) -> Delivery | None:
    """Mark ``d`` delivered and claim the next pending row of its queue when it is due
    and free (a queue drains without waiting for a poll)."""
    await conn.execute(
        text(
            "UPDATE webhook_outbox SET status = 1, delivered_at = :t, lease_until = NULL, "
            "attempts = attempts + 1 WHERE delivery_id = :d"
        ),
        {"d": d.delivery_id, "t": now},
    )
    r = await conn.execute(
        text(
            "UPDATE webhook_outbox o SET lease_until = :l FROM ("
            "  SELECT delivery_id FROM webhook_outbox"
            "   WHERE webhook_id = :w AND conv_key = :c AND status = 0"
            "   ORDER BY delivery_id LIMIT 1 FOR UPDATE SKIP LOCKED"
            ") n WHERE o.delivery_id = n.delivery_id AND o.next_at <= :t "
            "AND (o.lease_until IS NULL OR o.lease_until < :t) "
            f"RETURNING {_prefixed('o')}"
        ),
        {"w": d.webhook_id, "c": d.conv_key, "t": now, "l": lease_until},
    )
    row = r.first()
    return _delivery(row) if row else None


async def attempt_failed(
    conn: AsyncConnection, delivery_id: int, next_at: int, error: str, give_up: bool
) -> None:
    await conn.execute(
        text(
            "UPDATE webhook_outbox SET attempts = attempts + 1, next_at = :n, last_error = :e, "
            "lease_until = NULL, status = CASE WHEN :g THEN 2 ELSE 0 END "
            "WHERE delivery_id = :d"
        ),
        {"d": delivery_id, "n": next_at, "e": error[:500], "g": give_up},
    )


async def release(conn: AsyncConnection, delivery_ids: list[int]) -> None:
    """Give claims back (the deliverer is stopping): taken again at once elsewhere."""
    await conn.execute(
        text("UPDATE webhook_outbox SET lease_until = NULL WHERE delivery_id = ANY(:d)"),
        {"d": delivery_ids},
    )


# ---- the deliveries API ----------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class DeliveryInfo:
    event_key: str
    type: str
    conv_key: str
    status: int
    attempts: int
    created_at: int
    last_error: str | None


async def deliveries(
    conn: AsyncConnection, webhook_id: int, status: int, limit: int
) -> list[DeliveryInfo]:
    r = await conn.execute(
        text(
            "SELECT event_key, type, conv_key, status, attempts, created_at, last_error "
            "FROM webhook_outbox WHERE webhook_id = :w AND status = :s "
            "ORDER BY delivery_id DESC LIMIT :n"
        ),
        {"w": webhook_id, "s": status, "n": limit},
    )
    return [DeliveryInfo(*row) for row in r]


async def retry(conn: AsyncConnection, webhook_id: int, event_key: str, now: int) -> bool:
    """A failed delivery goes back in its queue, with a fresh retry window."""
    r = await conn.execute(
        text(
            "UPDATE webhook_outbox SET status = 0, attempts = 0, next_at = :t, created_at = :t, "
            "lease_until = NULL WHERE webhook_id = :w AND event_key = :k AND status = 2 "
            "RETURNING delivery_id"
        ),
        {"w": webhook_id, "k": event_key, "t": now},
    )
    return r.first() is not None


async def depths(conn: AsyncConnection) -> dict[int, tuple[int, int | None]]:
    """Per live webhook: pending deliveries, and the oldest one's creation (ms)."""
    r = await conn.execute(
        text(
            "SELECT w.webhook_id, count(o.delivery_id), min(o.created_at) FROM webhooks w "
            "LEFT JOIN webhook_outbox o ON o.webhook_id = w.webhook_id AND o.status = 0 "
            "WHERE w.deleted_at IS NULL GROUP BY w.webhook_id"
        )
    )
    return {int(w): (int(n), oldest) for w, n, oldest in r}


async def prune(conn: AsyncConnection, delivered_before: int, failed_before: int) -> int:
    r = await conn.execute(
        text(
            "DELETE FROM webhook_outbox WHERE (status = 1 AND delivered_at < :d) "
            "OR (status = 2 AND created_at < :f)"
        ),
        {"d": delivered_before, "f": failed_before},
    )
    return int(r.rowcount or 0)
