"""Reactions: a member who can see a message puts an emoji on it or takes it back.

Written by the request, in one PostgreSQL transaction that locks the message row (so
the limits hold exactly under concurrency) and keeps a count row per (message, emoji)
next to the per-user rows, so a read takes the counts and never scans the reactions.
The ``reaction`` notice (``content: {"seq", "emoji", "user_id", "op": "add"|"remove"}``)
is written to the outbox in that same transaction and sent through the send pipeline
after the commit, so every device sees the change on the seq stream even when the
process dies in between. Idempotent: adding a reaction I have, or removing one I do not have,
changes nothing and sends no notice."""

from __future__ import annotations

from typing import Literal

from im_server.context import Context
from im_server.errors import ImError, bad_request, not_found
from im_server.protocol.ids import ConvRef
from im_server.protocol.types import EMOJI_RULE, SERVER_CONTENT_TYPES, valid_emoji
from im_server.services import outbox, permissions
from im_server.services.recall import visible_message
from im_server.storage import reactions


def check_emoji(emoji: str) -> str:
    if not valid_emoji(emoji):
        raise bad_request(f"emoji {EMOJI_RULE}")
    return emoji


async def do_react(
    ctx: Context, user_id: int, ref: ConvRef, seq: int, emoji: str, op: Literal["add", "remove"]
) -> bool:
    """Add or remove my reaction; True when it changed (and a notice was sent)."""
    check_emoji(emoji)
    if ref.kind == "single" and not ref.has_user(user_id):
        raise ImError("not_member", "this single chat is not yours")
    msg, m = await visible_message(ctx, user_id, ref, seq)
    if msg is None or msg["content_type"] in SERVER_CONTENT_TYPES:
        raise not_found("no such message")
    if ref.kind == "group" and not m.active:
        raise ImError("not_member", "you are no longer a member of this group")
    # the rules of a send in this conversation (a block, a removed friend, a mute), then
    # its rate: before any change, so a refusal appends nothing
    await permissions.check_write(ctx, ref, user_id)
    await ctx.rate.send.hold(user_id, "messages")
    s = ctx.settings
    async with ctx.db.begin() as conn:
        recalled = await reactions.lock_message(conn, ref.conv_id, seq)
        if recalled is None:
            raise not_found("no such message")
        if recalled:
            raise ImError("conflict", "the message was recalled")
        if op == "add":
            have = await reactions.mine(conn, ref.conv_id, seq, user_id)
            if emoji in have:
                return False
            if len(have) >= s.reaction_max_per_user:
                raise ImError(
                    "conflict", f"at most {s.reaction_max_per_user} reactions per user on a message"
                )
            present = await reactions.emojis(conn, ref.conv_id, seq)
            if emoji not in present and len(present) >= s.reaction_max_emojis:
                raise ImError(
                    "conflict", f"at most {s.reaction_max_emojis} different emojis on a message"
                )
            changed = await reactions.add(conn, ref.conv_id, seq, user_id, emoji)
        else:
            changed = await reactions.remove(conn, ref.conv_id, seq, user_id, emoji)
        if not changed:
            return False
        notice = await outbox.emit(
            conn,
            user_id,
            ref.conv_id,
            "reaction",
            {"seq": seq, "emoji": emoji, "user_id": user_id, "op": op},
        )
    await outbox.deliver(ctx, [notice])
    return True
