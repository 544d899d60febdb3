"""Pictures and files (PROTOCOL.md, "Attachments"): hand out presigned uploads, check an
upload when a send names it and write the message's content from what the server knows,
let the uploader and the members who can see a message carrying it fetch it, and delete
the uploads nobody sent.

The bytes go from the client straight to the S3-compatible store and back. The client
PUTs to ``u/<upload_id>`` through its presigned URL; the first send that names the upload
*seals* it: the server copies those bytes, server-side, to ``s/<upload_id>``, a key no
client ever had a URL for, and checks that copy (its size; for an image, its signature
and dimensions). Every download and thumbnail reads the sealed copy from then on, so a
later PUT to the still-valid URL changes nothing anyone downloads, and what was checked
is exactly what is served (a PUT racing the copy lands before it, and is what gets
checked, or after it, and is never read). Once the URL has expired the client's key is
deleted. Text sends never come here."""

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
    attachment_content,
    clean_filename,
    valid_upload_id,
)
from im_server.protocol.image_formats import ImageFormat, sniff
from im_server.storage import uploads as store
from im_server.storage.db import now_ms
from im_server.storage.objects import ObjectStoreError

log = logging.getLogger("im_server.uploads")

# how much of an image is read for its dimensions: the header, and EXIF before it
HEAD_BYTES = (64 * 1024, 1024 * 1024)
_ORIENTATION = 0x0112  # EXIF: 5-8 are turned a quarter, so width and height swap


def object_key(upload_id: str) -> str:
    """Where the client's presigned PUT writes: never read once the upload is sealed."""
    return f"u/{upload_id}"


def sealed_key(upload_id: str) -> str:
    """The checked copy, made by the first send naming the upload; no URL ever writes it."""
    return f"s/{upload_id}"


def stored_key(up: store.Upload) -> str:
    """Where an upload's bytes are read: the sealed copy (an upload stored before sealing
    existed and never sent since keeps its bytes at the client's key)."""
    return sealed_key(up.upload_id) if up.sealed else object_key(up.upload_id)


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
    await ctx.rate.send.hold(user_id, "uploads")
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
    sender's, sealed (see the module), with the declared size; an image must be JPEG,
    PNG, GIF or WebP bytes. Returns the content as compact JSON. The upload's row stays
    locked meanwhile, so two sends naming it seal it once."""
    upload_id = str(content["upload_id"])
    caption = content.get("caption")
    now = now_ms()
    queued = False
    async with ctx.db.begin() as conn:
        up = await store.claim(conn, upload_id, sender_id, now)
        if up is None:
            raise bad_request("upload_id is not one of your uploads")
        if not up.sealed:
            info = await ctx.objects.copy(object_key(upload_id), sealed_key(upload_id))
            if info is None:
                raise bad_request("the upload has no bytes yet: PUT them to its URL first")
            if info.size != up.size:
                raise bad_request(f"the upload holds {info.size} bytes, not the {up.size} declared")
            await store.seal(conn, upload_id, now)
        width, height, mime = up.width, up.height, up.content_type
        if content_type == "image" and (width is None or height is None):
            width, height, fmt = await _dimensions(ctx, sealed_key(upload_id), up.size)
            mime = fmt.mime
            await store.set_image(conn, upload_id, width, height, mime)
            queued = True
    if queued:
        ctx.thumbnails_due.set()
    body = attachment_content(
        upload_id,
        up.filename or upload_id,
        up.size,
        mime,
        caption if isinstance(caption, str) else None,
        width if content_type == "image" else None,
        height if content_type == "image" else None,
    )
    return orjson.dumps(body).decode()


_NOT_AN_IMAGE = (
    "an image must be JPEG, PNG, GIF or WebP bytes (whatever type was declared); "
    "send other files as a file"
)


async def _dimensions(ctx: Context, key: str, size: int) -> tuple[int, int, ImageFormat]:
    """An image's width and height as shown (EXIF orientation applied), and its format,
    from its first bytes, read by the one decoder its signature names (nothing is
    decoded past the header); ``bad_request`` when they are not one of the four
    formats, or past the pixel limit."""
    limit = ctx.settings.image_max_pixels
    fmt: ImageFormat | None = None
    for n in HEAD_BYTES:
        head = await ctx.objects.get_range(key, 0, min(n, size) - 1)
        fmt = fmt or sniff(head)
        if fmt is None:
            raise bad_request(_NOT_AN_IMAGE)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(head), formats=[fmt.pillow]) as img:
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
        return ((height, width) if turned else (width, height)) + (fmt,)
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
        stored_key(up),
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
            keys = [object_key(u) for u, _ in rows] + [sealed_key(u) for u, _ in rows]
            keys += [thumbnail_key(u) for u, state in rows if state == "done"]
            await ctx.objects.delete(keys)
            await store.delete(conn, [u for u, _ in rows])
        gone += len(rows)
        metrics.UPLOADS.labels("expired").inc(len(rows))
        if len(rows) < batch:
            return gone


async def prune_raw(ctx: Context, batch: int = 100) -> int:
    """Delete the client's key of sealed uploads once their presigned URL has expired
    (nothing reads it, and nothing can write it again): a PUT after the send would
    otherwise keep its bytes in the bucket for good. Returns how many went."""
    if not await ensure_bucket(ctx):
        return 0
    # the URL was signed at the ticket, before the seal: this much after it, it is dead
    cutoff = now_ms() - (ctx.settings.upload_url_seconds + 60) * 1000
    gone = 0
    while True:
        async with ctx.db.begin() as conn:
            ids = await store.lock_raw_due(conn, cutoff, batch)
            if not ids:
                return gone
            await ctx.objects.delete([object_key(u) for u in ids])
            await store.raw_cleared(conn, ids, now_ms())
        gone += len(ids)
        if len(ids) < batch:
            return gone
