"""Pictures and files (PROTOCOL.md, "Attachments"): hand out presigned uploads, check an
upload when a send names it and write the message's content from what the server knows,
let the uploader and the members who can see a message carrying it fetch it, and delete
the uploads nobody sent.

The bytes go from the client straight to the S3-compatible store and back; the server
signs URLs, makes one ``HEAD`` per send (and, for a new image, reads its first bytes for
the dimensions), never more. Text sends never come here."""

from __future__ import annotations

import io
import logging
import secrets
import warnings
from dataclasses import dataclass

import orjson
from PIL import Image, UnidentifiedImageError
from pydantic import JsonValue

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, bad_request, not_found
from im_server.protocol.attachments import (
    IMAGE_TYPES,
    attachment_content,
    clean_filename,
    valid_upload_id,
)
from im_server.storage import uploads as store
from im_server.storage.db import now_ms
from im_server.storage.objects import ObjectStoreError

log = logging.getLogger("im_server.uploads")

# how much of an image is read for its dimensions: the header, and EXIF before it
HEAD_BYTES = (64 * 1024, 1024 * 1024)
_ORIENTATION = 0x0112  # EXIF: 5-8 are turned a quarter, so width and height swap


def object_key(upload_id: str) -> str:
    return f"u/{upload_id}"


def thumbnail_key(upload_id: str) -> str:
    return f"t/{upload_id}"


@dataclass(frozen=True, slots=True)
class Ticket:
    upload_id: str
    url: str
    headers: dict[str, str]
    expires_at: int


async def do_create(
    ctx: Context, user_id: int, content_type: str, size: int, filename: str | None
) -> Ticket:
    """Record a pending upload and sign the PUT that stores its bytes (bound to the
    declared type and size)."""
    s = ctx.settings
    if size > s.upload_max_bytes:
        raise ImError("too_large", f"size is {size} bytes, the limit is {s.upload_max_bytes}")
    name = None
    if filename is not None:
        try:
            name = clean_filename(filename)
        except ValueError as e:
            raise bad_request(str(e)) from None
    ctx.rate.send.check(user_id, "uploads")
    upload_id = secrets.token_urlsafe(16)
    now = now_ms()
    async with ctx.db.begin() as conn:
        await store.add(conn, upload_id, user_id, content_type, size, name, now)
    url, headers = await ctx.objects.presign_put(
        object_key(upload_id), content_type, size, s.upload_url_seconds
    )
    metrics.UPLOADS.labels("created").inc()
    return Ticket(upload_id, url, headers, now + s.upload_url_seconds * 1000)


async def check_attachment(
    ctx: Context, sender_id: int, content_type: str, content: dict[str, JsonValue]
) -> str:
    """The content to store for an ``image``/``file`` send: the upload must be the
    sender's and its bytes stored with the declared size (one HEAD); an image must be
    one of the readable formats. Returns the content as compact JSON."""
    upload_id = str(content["upload_id"])
    caption = content.get("caption")
    async with ctx.db.begin() as conn:
        up = await store.claim(conn, upload_id, sender_id, now_ms())
    if up is None:
        raise bad_request("upload_id is not one of your uploads")
    info = await ctx.objects.head(object_key(upload_id))
    if info is None:
        raise bad_request("the upload has no bytes yet: PUT them to its URL first")
    if info.size != up.size:
        raise bad_request(f"the upload holds {info.size} bytes, not the {up.size} declared")
    width, height = up.width, up.height
    if content_type == "image":
        if up.content_type not in IMAGE_TYPES:
            raise bad_request(f"an image must be one of {', '.join(sorted(IMAGE_TYPES))}")
        if width is None or height is None:
            width, height = await _dimensions(ctx, upload_id, up.size)
            async with ctx.db.begin() as conn:
                await store.set_image(conn, upload_id, width, height)
            ctx.thumbnails_due.set()
    body = attachment_content(
        upload_id,
        up.filename or upload_id,
        up.size,
        up.content_type,
        caption if isinstance(caption, str) else None,
        width if content_type == "image" else None,
        height if content_type == "image" else None,
    )
    return orjson.dumps(body).decode()


async def _dimensions(ctx: Context, upload_id: str, size: int) -> tuple[int, int]:
    """An image's width and height as shown (EXIF orientation applied), from its first
    bytes; ``bad_request`` when they are not an image, or one past the pixel limit."""
    limit = ctx.settings.image_max_pixels
    for n in HEAD_BYTES:
        head = await ctx.objects.get_range(object_key(upload_id), 0, min(n, size) - 1)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(head)) as img:
                    width, height = img.size
                    turned = img.getexif().get(_ORIENTATION) in (5, 6, 7, 8)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
            if n >= size:
                break
            continue  # the header may lie further in (a large EXIF block): read more
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise bad_request(f"the image has more than {limit} pixels") from None
        if width * height > limit:
            raise bad_request(f"the image has more than {limit} pixels")
        return (height, width) if turned else (width, height)
    raise bad_request("the upload is not an image this server can read")


async def do_fetch(ctx: Context, user_id: int, upload_id: str, thumbnail: bool) -> str:
    """A short-lived download URL, for the uploader and for the members whose window
    holds a stored, non-recalled message carrying the upload; ``not_found`` for anyone
    else, and for what does not exist (the answers do not tell the two apart)."""
    if not valid_upload_id(upload_id):
        raise not_found("no such upload")
    async with ctx.db.connect() as conn:
        up = await store.visible(conn, upload_id, user_id)
    if up is None:
        raise not_found("no such upload")
    expires = ctx.settings.download_url_seconds
    if thumbnail:
        if up.thumb_state != "done":
            raise not_found("no thumbnail: not an image, or not made yet")
        return await ctx.objects.presign_get(
            thumbnail_key(upload_id), expires, content_type=up.thumb_type
        )
    return await ctx.objects.presign_get(
        object_key(upload_id),
        expires,
        filename=up.filename or upload_id,
        content_type=up.content_type,
    )


async def ensure_bucket(ctx: Context) -> bool:
    """Make the bucket when missing (at start, and before each clean-up until it
    worked): a store that is down at start must not keep the server from starting."""
    if ctx.bucket_ready:
        return True
    try:
        await ctx.objects.ensure_bucket()
    except ObjectStoreError as e:
        log.warning("object store: cannot check the bucket yet (%s); uploads wait for it", e)
        return False
    ctx.bucket_ready = True
    return True


async def prune_unsent(ctx: Context, batch: int = 100) -> int:
    """Delete the uploads no stored message carries, older than
    ``IM_UPLOAD_UNSENT_HOURS`` (made and last claimed by a send): their objects, then
    their rows, the rows locked meanwhile so no send can claim one half-deleted.
    Returns how many went."""
    if not await ensure_bucket(ctx):
        return 0
    cutoff = now_ms() - int(ctx.settings.upload_unsent_hours * 3600_000)
    gone = 0
    while True:
        async with ctx.db.begin() as conn:
            rows = await store.lock_unsent(conn, cutoff, batch)
            if not rows:
                return gone
            keys = [object_key(u) for u, _ in rows]
            keys += [thumbnail_key(u) for u, state in rows if state == "done"]
            await ctx.objects.delete(keys)
            await store.delete(conn, [u for u, _ in rows])
        gone += len(rows)
        metrics.UPLOADS.labels("expired").inc(len(rows))
        if len(rows) < batch:
            return gone
