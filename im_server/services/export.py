"""``GET /v1/me/export``: my data as one JSON document, streamed.

``{"user": {user_id, username, display_name}, "friends": [{user_id, username}],
"blocks": [user_id], "groups": [{group_id, name, role}], "messages": [message...]}``,
where ``messages`` are the ones I sent (in persisted conversations, by conv_id then
seq). The profile and the small lists are read first (so a gone user is refused before
anything is sent); the messages follow in keyset pages of ``PAGE`` rows, each page read
on a connection of its own and written out before the next is read, so neither a whole
history nor a database connection is held while the client reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from im_server.context import Context
from im_server.errors import ImError
from im_server.storage import accounts, contacts
from im_server.storage import export as store

PAGE = 500


async def prepare(ctx: Context, user_id: int) -> dict[str, Any]:
    """Everything but the messages; ``unauthorized`` for a user that is gone."""
    async with ctx.db.connect() as conn:
        user = await accounts.user_by_id(conn, user_id)
        if user is None or user.deleted:
            raise ImError("unauthorized", "user is gone")
        friends = await contacts.friends_of(conn, user_id)
        blocks = await contacts.blocks_of(conn, user_id)
        groups = await store.groups_of(conn, user_id)
    return {
        "user": {
            "user_id": user.user_id,
            "username": user.username,
            "display_name": user.display_name,
        },
        "friends": [{"user_id": u, "username": n} for u, n in friends],
        "blocks": blocks,
        "groups": groups,
    }


async def stream(ctx: Context, user_id: int, head: dict[str, Any]) -> AsyncIterator[bytes]:
    """The document: ``head`` (from ``prepare``), then my messages page by page."""
    yield orjson.dumps(head)[:-1] + b',"messages":['
    async with ctx.db.connect() as conn:
        conv_ids = await store.conversations_of(conn, user_id)
    first = True
    for conv_id in conv_ids:
        after = 0
        while True:
            async with ctx.db.connect() as conn:
                page = await store.sent_page(conn, conv_id, user_id, after, PAGE)
            if not page:
                break
            chunk = b",".join(orjson.dumps(m) for m in page)
            yield chunk if first else b"," + chunk
            first = False
            after = int(page[-1]["seq"])
            if len(page) < PAGE:
                break
    yield b"]}"
