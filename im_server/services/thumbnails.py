"""Thumbnails of pictures: at most ``THUMBNAIL_PX`` on the longer side, JPEG (PNG when the
picture has transparency), turned as its EXIF orientation says, and with no metadata at
all (a phone photo's EXIF holds where it was taken). A pure function over bytes, run in a
process of its own by the worker (``workers/thumbnails.py``), so the decoded pixels
(up to the pixel limit: hundreds of MB) never stay in the server's memory. Only JPEG,
PNG, GIF and WebP, told by their signature, are decoded, each by its own decoder alone
(``protocol/image_formats.py``).

Untrusted input: a picture past the pixel limit (a "decompression bomb": a few KB that
decode to gigabytes) or one that does not decode raises :class:`BadImage`, which the
worker records as a failed thumbnail; nothing else happens to the process."""

from __future__ import annotations

import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from im_server.protocol.image_formats import SNIFF_BYTES, sniff

THUMBNAIL_PX = 320


class BadImage(ValueError):
    """Not a picture this server makes thumbnails of (unreadable, or too many pixels)."""


def make_thumbnail(data: bytes, max_pixels: int, px: int = THUMBNAIL_PX) -> tuple[bytes, str]:
    """(thumbnail bytes, its media type)."""
    fmt = sniff(data[:SNIFF_BYTES])
    if fmt is None:
        raise BadImage("not JPEG, PNG, GIF or WebP bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[fmt.pillow]) as img:
                w, h = img.size
                if w * h > max_pixels:
                    raise BadImage(f"{w}x{h} is more than {max_pixels} pixels")
                img.draft("RGB", (px, px))  # JPEG: decode at a reduced scale when it can
                img.load()
                shown = ImageOps.exif_transpose(img) or img
                shown.thumbnail((px, px), Image.Resampling.LANCZOS)
                alpha = shown.mode in ("RGBA", "LA", "PA") or (
                    shown.mode == "P" and "transparency" in shown.info
                )
                out = io.BytesIO()
                if alpha:
                    shown.convert("RGBA").save(out, "PNG", optimize=True)
                    return out.getvalue(), "image/png"
                shown.convert("RGB").save(out, "JPEG", quality=82, optimize=True)
                return out.getvalue(), "image/jpeg"
    except BadImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadImage(f"too many pixels: {e}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as e:
        raise BadImage(f"not a readable picture: {type(e).__name__}") from None
