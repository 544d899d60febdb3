"""The checks of a send that need the server, once the protocol models have checked its
fields: the content's size and storability, the sender's place in a single chat, the
rate, and for a send that mentions, replies or carries an upload, the members, the
sender's window and the upload (a plain send never needs those, so its path keeps its
one Redis call). Used by the send use case (``services/send.py``) and by edits."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from pydantic import JsonValue

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, bad_request
from im_server.protocol.attachments import ATTACHMENT_TYPES
from im_server.protocol.client_frames import SendFields
from im_server.protocol.ids import ConvRef
from im_server.protocol.server_frames import AckOk, ack
from im_server.protocol.session import SendCmd
from im_server.services import members, permissions, seqs, uploads
from im_server.services.history import window
from im_server.storage import conversations

_DUP = metrics.SENDS.labels("duplicate")


def check_send(ctx: Context, sender_id: int, ref: ConvRef, content: dict[str, JsonValue]) -> str:
    """The checks of a send (frame or REST body) that need the server, once the protocol
    models have checked the fields: the content's size and storability, the sender's
    place in a single chat, the rate limit. Returns the content as compact JSON."""
    encoded = encode_content(ctx, content)
    if ref.kind == "single" and not ref.has_user(sender_id):
        raise ImError("not_member", "this single chat is not yours")
    ctx.rate.send.check(sender_id, "messages")
    return encoded


def encode_content(ctx: Context, content: dict[str, JsonValue]) -> str:
    """A message's content as compact JSON, if it can be stored: encodable, no NUL
    character (jsonb cannot hold one), within ``IM_MAX_CONTENT_BYTES``."""
    try:
        encoded = orjson.dumps(content)
    except (TypeError, orjson.JSONEncodeError) as e:
        raise bad_request(f"content cannot be encoded: {e}") from e
    if b"\\u0000" in encoded and _has_nul(content):  # jsonb cannot hold a NUL character
        raise bad_request("content must not contain NUL characters")
    if len(encoded) > ctx.settings.max_content_bytes:
        raise ImError(
            "too_large",
            f"content is {len(encoded)} bytes, the limit is {ctx.settings.max_content_bytes}",
        )
    return encoded.decode()


def _has_nul(value: JsonValue) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


@dataclass(slots=True)
class Extras:
    """What a send mentions and answers, once checked by :func:`check_extras`."""

    mentions: list[int]
    mention_all: bool
    reply_to: int | None
    # a picture or file: the content the server wrote from the upload (None: as sent)
    content_json: str | None = None


async def check_extras(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    mentions: list[int],
    mention_all: bool,
    reply_to: int | None,
) -> Extras:
    """The checks of a send that mentions or replies (a plain send never comes here, so
    its path keeps its one Redis call). Mentions are for groups: in a single chat they
    are refused (``bad_request``); ids that are not active members now are dropped
    (from the members cache), the rest kept once each, ascending. ``mention_all`` needs
    the owner or an admin (``forbidden``). ``reply_to`` must be in the sender's window:
    not below its start (a clear, a join without history) and not above its end (a
    kick) nor above the conversation's allocated end (``bad_request``)."""
    if ref.kind == "single" and (mentions or mention_all):
        raise bad_request("mentions and mention_all are for group messages only")
    if not mentions and not mention_all and reply_to is None:
        return Extras([], False, None)
    async with ctx.db.connect() as conn:
        conv, me = await conversations.conv_and_member(conn, ref.conv_id, sender_id)
    if ref.kind == "group" and (me is None or not me.active):
        raise ImError("not_member", permissions.DENIED["not_member"])
    if mention_all and (me is None or me.role < conversations.ROLE_ADMIN):
        raise ImError("forbidden", "only the group's owner and admins can mention all")
    if reply_to is not None:
        if conv is None or me is None:
            raise bad_request(_BAD_REPLY)
        win = window(conv, me)
        if reply_to < win.lo or (me.max_seq is not None and reply_to > me.max_seq):
            raise bad_request(_BAD_REPLY)
        if reply_to > conv.max_seq and reply_to > await seqs.current_end(ctx, ref.conv_id):
            raise bad_request(_BAD_REPLY)
    kept: list[int] = []
    if mentions:
        current = set(await members.recipients(ctx, ref))
        kept = sorted({u for u in mentions if u in current})
    return Extras(kept, mention_all, reply_to)


async def earlier_ack(ctx: Context, conv_id: str, sender_id: int, cmid: str) -> AckOk | None:
    """The first ack of a send repeated after its checks stopped passing (the sender was
    kicked, its reply target cleared): a repeat answers what the first send got, never a
    refusal of a message that exists. Asked only once a check refused, so a plain or
    accepted send pays nothing. Redis first; PostgreSQL when Redis forgot the key."""
    found = await ctx.redis.get_dedupe(conv_id, sender_id, cmid)
    if found is None:
        found = await ctx.dedupe_checker.submit((sender_id, cmid))
    if found is None:
        return None
    _DUP.inc()
    return ack(found.conv_id, cmid, found.seq, found.server_time, True)


async def checked_extras(
    ctx: Context,
    sender_id: int,
    ref: ConvRef,
    fields: SendFields | SendCmd,
) -> Extras | AckOk:
    """:func:`check_extras` and, for a picture or file, the upload's check
    (``services.uploads.check_attachment``), or the first ack when a refused send is a
    repeat."""
    cmid = fields.client_msg_id
    try:
        extras = await check_extras(
            ctx, sender_id, ref, fields.mentions, fields.mention_all, fields.reply_to
        )
        if fields.content_type in ATTACHMENT_TYPES:
            extras.content_json = await uploads.check_attachment(
                ctx, sender_id, fields.content_type, fields.content
            )
        return extras
    except ImError:
        first = await earlier_ack(ctx, ref.conv_id, sender_id, cmid)
        if first is None or first["conv_id"] != ref.conv_id:
            raise
        return first


_BAD_REPLY = "reply_to must be the seq of a message you can see in this conversation"
