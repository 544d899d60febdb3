"""Edit: the sender, within the edit window, replaces a message's content.

An ``edit`` notice (``content: {"seq": <original>, "content": <new content>}``) goes
through the send pipeline like any message, so every device gets it on the seq stream;
the original then reads with the new content and ``edited_at``. The original is updated
twice on purpose, as recall blanks it: here right after the notice is queued (so the
caller reads its edit at once), and by the persister when it stores the notice (durable
state drives it: a crash between the ack and the update loses nothing). Each update
carries the notice's seq and only a higher one wins (``storage.edits``), so the two
writers and concurrent edits always end on the newest edit.

Idempotent: an edit to the content the message has is answered with the current edit
and sends nothing. A repeat of a request (a client retrying, possibly concurrently) uses
the same notice ``client_msg_id``, derived from (message, edit it replaces, content), so
the pipeline's dedupe answers it with the first notice instead of making a second."""

from __future__ import annotations

import hashlib
import time

import orjson
from pydantic import JsonValue
from pydantic_core import PydanticCustomError

from im_server.context import Context
from im_server.errors import ImError, bad_request, not_found
from im_server.protocol.attachments import ATTACHMENT_TYPES, check_attachment_content
from im_server.protocol.client_frames import TEXT_RULE
from im_server.protocol.ids import ConvRef
from im_server.protocol.server_frames import Edited, edited
from im_server.protocol.types import SERVER_CONTENT_TYPES
from im_server.services import send, send_checks, uploads
from im_server.services.recall import visible_message
from im_server.storage import edits
from im_server.storage.edits import Edit
from im_server.storage.messages import NewMessage


def notice_client_msg_id(conv_id: str, seq: int, base: int | None, content_json: str) -> str:
    """The notice's id: the same for the same edit of the same state of the message."""
    h = hashlib.sha256(f"{conv_id}\0{seq}\0{base or 0}\0{content_json}".encode()).hexdigest()
    return f"edit-{h[:40]}"


async def do_edit(
    ctx: Context, user_id: int, ref: ConvRef, seq: int, content: dict[str, JsonValue]
) -> Edited:
    """Edit the caller's message at ``seq``; the ``edited`` answer."""
    content_json = send_checks.check_send(ctx, user_id, ref, content)  # size, NUL, rate
    msg, m = await visible_message(ctx, user_id, ref, seq)
    if msg is None or msg["content_type"] in SERVER_CONTENT_TYPES:
        raise not_found("no such message")
    if msg["sender_id"] != user_id:
        raise ImError("forbidden", "only the sender can edit a message")
    if ref.kind == "group" and not m.active:
        raise ImError("not_member", "you are no longer a member of this group")
    if msg["recalled"]:
        raise ImError("conflict", "the message was recalled")
    window = ctx.settings.edit_window_seconds
    if time.time() * 1000 - msg["server_time"] > window * 1000:
        raise ImError("forbidden", f"messages can be edited for {window} s")
    if msg["content_type"] == "text":
        text_ = content.get("text")
        if not isinstance(text_, str) or not text_:
            raise bad_request(f"content: {TEXT_RULE}")
    if msg["content_type"] in ATTACHMENT_TYPES:
        # a picture or file keeps its upload; only the caption changes (the content is
        # written from the upload again, as at the send)
        if content.get("upload_id") != msg["content"].get("upload_id"):
            raise bad_request("an edit of a picture or file keeps its upload_id")
        try:
            check_attachment_content(msg["content_type"], content)
        except PydanticCustomError as e:
            raise bad_request(f"content: {e.message()}") from None
        content_json = await uploads.check_attachment(ctx, user_id, msg["content_type"], content)
        content = orjson.loads(content_json)
    async with ctx.db.connect() as conn:
        now = await edits.current(conn, ref.conv_id, seq)
    if now is None:
        raise not_found("no such message")
    have, base, edited_at = now
    if have == content:
        return edited(ref.conv_id, seq, base, edited_at)
    if have is None:  # recalled since the checks above
        raise ImError("conflict", "the message was recalled")
    ack = await send.do_send(
        ctx,
        user_id,
        ref,
        notice_client_msg_id(ref.conv_id, seq, base, content_json),
        "edit",
        f'{{"seq":{seq},"content":{content_json}}}',
    )  # with the sender's rights checked: an edit brings new content, as a send does
    async with ctx.db.begin() as conn:
        await edits.apply(
            conn, [Edit(ref.conv_id, seq, content_json, ack["seq"], ack["server_time"])]
        )
    return edited(ref.conv_id, seq, ack["seq"], ack["server_time"])


def edit_of(m: NewMessage) -> Edit | None:
    """The edit an ``edit`` notice carries, None for any other message (or a notice
    that does not hold ``{"seq": <int>, "content": {...}}``: it names nothing rather
    than stopping the persister's batch)."""
    if m.content_type != "edit":
        return None
    try:
        body = orjson.loads(m.content_json)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    target, content = body.get("seq"), body.get("content")
    if not isinstance(target, int) or isinstance(target, bool) or not isinstance(content, dict):
        return None
    return Edit(m.conv_id, target, orjson.dumps(content).decode(), m.seq, m.server_time)
