"""What an ``image`` is: JPEG, PNG, GIF or WebP bytes, told by their first bytes (their
signatures), never by the type a client declared. Only these four are ever decoded, by
the decoders of these four alone: every other format Pillow can read (BMP, TIFF, PCX,
SGI, PSD, ...) is another parser an attacker could reach, for pictures no browser shows
inline anyway. Other bytes may still be sent as a ``file``, which is never decoded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class ImageFormat:
    pillow: str  # Pillow's name of the format (its decoder)
    mime: str


JPEG: Final = ImageFormat("JPEG", "image/jpeg")
PNG: Final = ImageFormat("PNG", "image/png")
GIF: Final = ImageFormat("GIF", "image/gif")
WEBP: Final = ImageFormat("WEBP", "image/webp")
IMAGE_FORMATS: Final = (JPEG, PNG, GIF, WEBP)
PILLOW_NAMES: Final = tuple(f.pillow for f in IMAGE_FORMATS)
SNIFF_BYTES: Final = 12  # enough for every signature below


def sniff(head: bytes) -> ImageFormat | None:
    """The format of bytes that start with ``head``, or None when they are none of the
    four (a signature is necessary, not sufficient: the decoder still has its say)."""
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return WEBP
    return None
