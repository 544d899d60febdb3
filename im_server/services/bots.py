"""Bots: users of kind ``bot`` (made by the app's servers). Anyone may open a single
chat with a bot without a friend request; it is a friendship made at once, so every
rule of single chats applies from then on (a block, a removal, the windows)."""

from __future__ import annotations

from im_server.context import Context
from im_server.errors import ImError, bad_request, not_found
from im_server.protocol.ids import single_conv_id
from im_server.services import contacts, quotas
from im_server.storage import app_users
from im_server.storage import contacts as contact_store


async def open_chat(ctx: Context, me: int, bot_id: int) -> str:
    """The conversation of my chat with the bot, made if need be."""
    if bot_id == me:
        raise bad_request("a bot cannot open a chat with itself")
    async with ctx.db.connect() as conn:
        kind = await app_users.kind_of(conn, bot_id)
        if kind != "bot":
            raise not_found("no such bot")
        if await contact_store.are_friends(conn, me, bot_id):
            return single_conv_id(me, bot_id)
        if await contact_store.blocked_by(conn, me, [bot_id]):
            raise ImError("blocked", "this bot does not accept chats from you")
    await quotas.friend_request(ctx, me)  # a new chat counts like a friend request
    return await contacts.befriend_now(ctx, me, bot_id)
