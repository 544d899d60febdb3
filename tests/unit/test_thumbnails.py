"""Thumbnails (``services/thumbnails.py``): the size bound, EXIF orientation applied and
all metadata stripped, transparency kept as PNG, and hostile input (a decompression bomb,
garbage, a truncated file) refused with :class:`BadImage`, nothing else."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from im_server.services.thumbnails import THUMBNAIL_PX, BadImage, make_thumbnail
from tests.support import png_bomb

LIMIT = 40_000_000


def jpeg(w: int, h: int, exif: Image.Exif | None = None) -> bytes:
    img = Image.new("RGB", (w, h), (200, 30, 30))
    # the top-left quarter blue, so orientation can be checked
    img.paste((20, 20, 220), (0, 0, w // 2, h // 2))
    out = io.BytesIO()
    img.save(out, "JPEG", exif=exif if exif is not None else Image.Exif())
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def test_a_big_photo_becomes_at_most_320px_jpeg() -> None:
    data, mime = make_thumbnail(jpeg(1600, 900), LIMIT)
    img = opened(data)
    assert mime == "image/jpeg" and img.format == "JPEG"
    assert img.size == (THUMBNAIL_PX, 180)


def test_a_small_picture_keeps_its_size() -> None:
    img = opened(make_thumbnail(jpeg(100, 50), LIMIT)[0])
    assert img.size == (100, 50)


def test_exif_orientation_is_applied_and_gps_and_all_metadata_stripped() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # turned 90° clockwise when shown
    exif[0x010F] = "PhoneMaker"
    gps = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 7.0)}
    exif[0x8825] = gps
    src = jpeg(800, 400, exif)
    assert opened(src).getexif().get(0x8825), "the source does carry GPS"
    img = opened(make_thumbnail(src, LIMIT)[0])
    assert img.size == (160, THUMBNAIL_PX), "turned: portrait"
    assert len(img.getexif()) == 0
    assert "exif" not in img.info and "xmp" not in img.info and "icc_profile" not in img.info
    # the blue quarter was top-left; turned 90° clockwise it is top-right
    assert img.getpixel((img.width - 10, 10))[2] > 150
    assert img.getpixel((10, 10))[0] > 150


def test_transparency_is_kept_as_png() -> None:
    img = Image.new("RGBA", (640, 640), (0, 0, 0, 0))
    out = io.BytesIO()
    img.save(out, "PNG")
    data, mime = make_thumbnail(out.getvalue(), LIMIT)
    assert mime == "image/png"
    thumb = opened(data)
    assert thumb.mode == "RGBA" and thumb.size == (THUMBNAIL_PX, THUMBNAIL_PX)


def test_a_decompression_bomb_is_refused_without_decoding_it() -> None:
    bomb = png_bomb(100_000, 100_000)  # 10 gigapixels
    assert len(bomb) < 100_000
    with pytest.raises(BadImage, match="pixels"):
        make_thumbnail(bomb, LIMIT)


def test_just_past_the_limit_is_refused_too() -> None:
    with pytest.raises(BadImage):
        make_thumbnail(png_bomb(7000, 6000), LIMIT)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an image at all",
        b"\x89PNG\r\n\x1a\n" + b"\0" * 40,
        b"\xff\xd8\xff\xe0" + b"x" * 100,
    ],
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(BadImage):
        make_thumbnail(data, LIMIT)


def test_a_truncated_jpeg_is_refused_or_thumbnailed_never_crashes() -> None:
    src = jpeg(1200, 800)
    for cut in (len(src) // 3, len(src) // 2, len(src) - 10):
        try:
            data, _ = make_thumbnail(src[:cut], LIMIT)
        except BadImage:
            continue
        assert max(opened(data).size) <= THUMBNAIL_PX
