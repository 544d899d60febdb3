"""What anyone downloads is what the server checked (PROTOCOL.md, "Attachments"): once a
message carries an upload, a later PUT to its presigned URL changes nothing that is
downloaded or thumbnailed; ``image`` means JPEG, PNG, GIF or WebP bytes, told by their
content, and nothing else is ever decoded; a big picture's decoding leaves the server's
memory where it was."""

from __future__ import annotations

import io
import zlib
from typing import Any

import psutil
import pytest
from PIL import Image

from im_server.client import ApiError, Client, single_conv_id
from tests.support import Make, ServerProcess, Stores, befriend, eventually, persisted, pg


def picture(fmt: str, color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, fmt)
    return out.getvalue()


async def pair(make: Make) -> tuple[Client, Client, str]:
    a, b = await make("sa"), await make("sb")
    await befriend(a, b)
    return a, b, single_conv_id(a.user_id or 0, b.user_id or 0)


async def ticket_and_put(c: Client, data: bytes, ctype: str) -> dict[str, Any]:
    t = await c._obj("POST", "/v1/uploads", json={"content_type": ctype, "size": len(data)})
    r = await c.http.put(t["url"], content=data, headers=t["headers"])
    assert r.status_code == 200, r.text
    return t


async def thumbnail(c: Client, upload_id: str) -> bytes:
    async def made() -> bytes | None:
        try:
            return await c.download(upload_id, thumbnail=True)
        except ApiError as e:
            assert e.status == 404
            return None

    data: bytes = await eventually(made, timeout=30)
    return data


async def test_bytes_put_after_the_send_are_never_downloaded(make: Make, stores: Stores) -> None:
    a, b, conv = await pair(make)
    original = picture("PNG", (200, 20, 20))
    t = await ticket_and_put(a, original, "image/png")
    up = t["upload_id"]
    ack = await a.send_rest(conv, {"upload_id": up}, "image")
    assert ack["ok"], ack
    await persisted(a, conv, ack["seq"])
    # the URL is still valid: the same size, other bytes (another picture, then junk)
    swapped = picture("PNG", (20, 20, 200))
    swapped = (swapped + b"\0" * len(original))[: len(original)]
    r = await a.http.put(t["url"], content=swapped, headers=t["headers"])
    assert r.status_code == 200, r.text  # the store takes it: nobody will ever read it
    assert await b.download(up) == original
    assert await a.download(up) == original
    thumb = Image.open(io.BytesIO(await thumbnail(b, up))).convert("RGB")
    assert thumb.getpixel((0, 0))[0] > 150, "the thumbnail is not of the checked picture"
    # a second message naming the same upload, and an edit of the first, keep it too
    again = await a.send_rest(conv, {"upload_id": up, "caption": "again"}, "image")
    assert again["ok"], again
    await a.edit(conv, ack["seq"], {"upload_id": up, "caption": "edited"})
    await persisted(a, conv, again["seq"])
    [m] = (await b.history(conv, again["seq"], again["seq"]))["messages"]
    assert m["content"]["size"] == len(original) and m["content"]["mime"] == "image/png"
    assert await b.download(up) == original
    async with pg(stores) as db:
        sealed = await db.fetchval("SELECT sealed_at FROM uploads WHERE upload_id = $1", up)
    assert sealed is not None


async def test_a_file_put_again_after_the_send_keeps_its_first_bytes(make: Make) -> None:
    a, b, conv = await pair(make)
    first = b"first version of the contract " * 10
    t = await ticket_and_put(a, first, "text/plain")
    ack = await a.send_rest(conv, {"upload_id": t["upload_id"]}, "file")
    assert ack["ok"], ack
    second = b"SECOND version of the contract" * 10
    assert len(second) == len(first)
    r = await a.http.put(t["url"], content=second, headers=t["headers"])
    assert r.status_code == 200
    assert await b.download(t["upload_id"]) == first


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "PCX", "SGI"])
async def test_other_formats_are_not_images_and_are_never_decoded(
    make: Make, stores: Stores, fmt: str
) -> None:
    """Bytes of another format declared as PNG: refused as an ``image``; accepted as a
    ``file``, downloaded as they are, and no thumbnail is made of them."""
    a, b, conv = await pair(make)
    data = picture(fmt, (10, 200, 10))
    up = (await ticket_and_put(a, data, "image/png"))["upload_id"]
    with pytest.raises(ApiError) as e:
        await a.send_rest(conv, {"upload_id": up}, "image")
    assert (e.value.status, e.value.code) == (400, "bad_request"), e.value
    assert "JPEG, PNG, GIF or WebP" in e.value.message
    ack = await a.send_rest(conv, {"upload_id": up}, "file")
    assert ack["ok"], ack
    await persisted(a, conv, ack["seq"])
    assert await b.download(up) == data
    with pytest.raises(ApiError) as e:
        await b.download(up, thumbnail=True)
    assert e.value.status == 404
    async with pg(stores) as db:
        state = await db.fetchval("SELECT thumb_state FROM uploads WHERE upload_id = $1", up)
    assert state == "none"


@pytest.mark.parametrize(
    ("fmt", "mime"),
    [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("GIF", "image/gif"), ("WEBP", "image/webp")],
)
async def test_the_four_formats_are_images_by_their_bytes(make: Make, fmt: str, mime: str) -> None:
    """Declared as something else, the bytes decide: the message carries their type."""
    a, b, conv = await pair(make)
    data = picture(fmt, (120, 120, 0), (90, 30))
    up = (await ticket_and_put(a, data, "application/octet-stream"))["upload_id"]
    ack = await a.send_rest(conv, {"upload_id": up}, "image")
    assert ack["ok"], ack
    await persisted(a, conv, ack["seq"])
    [m] = (await b.history(conv, ack["seq"], ack["seq"]))["messages"]
    assert (m["content"]["mime"], m["content"]["width"], m["content"]["height"]) == (mime, 90, 30)
    assert Image.open(io.BytesIO(await thumbnail(b, up))).size == (90, 30)  # never enlarged


def big_png(w: int, h: int) -> bytes:
    """A real, fully decodable w×h RGB PNG of one colour: a few hundred KB that decode to
    w×h×3 bytes of pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
        )

    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    row = b"\0" + b"\x40\x80\xc0" * w
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(h)) + comp.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


async def test_a_big_picture_leaves_the_server_memory_where_it_was(
    make: Make, server: ServerProcess
) -> None:
    """A ~40-megapixel PNG (120 MB of pixels) is decoded for its thumbnail outside the
    server process: the server's resident memory does not keep it."""
    assert server.proc is not None
    me = psutil.Process(server.proc.pid)
    a, b, conv = await pair(make)
    data = big_png(6320, 6300)  # 39.8 megapixels, under the 40-megapixel limit
    assert len(data) < 1024 * 1024
    before = me.memory_info().rss
    up = await a.upload(data, "image/png", "big.png")
    ack = await a.send_rest(conv, {"upload_id": up}, "image")
    assert ack["ok"], ack
    thumb = Image.open(io.BytesIO(await thumbnail(b, up)))
    assert thumb.size == (320, 319)
    grew = me.memory_info().rss - before
    # decoded in the server this was ~+400 MB, kept for good; the bytes themselves pass
    # through it (a few hundred KB) and buffers settle: 60 MB of room for noise
    assert grew < 60 * 1024 * 1024, f"the server kept {grew / 2**20:.0f} MB"
