"""Pictures and files (PROTOCOL.md, "Attachments") against the embedded S3-compatible store
the suite starts: presigned uploads, the checks of a send that names one, the content
the server writes, access by window (joined without history, kicked, cleared, recalled,
outsiders), thumbnails, edits of captions, and bad input."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from im_server.client import ApiError, Client, group_conv_id, single_conv_id
from im_server.client.http_files import UPLOAD_CHUNK
from im_server.client.transport import Response
from tests.support import Make, Stores, befriend, eventually, persisted, pg, png_bomb


def jpeg(w: int = 1200, h: int = 800) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (30, 120, 200)).save(out, "JPEG")
    return out.getvalue()


async def ticket(c: Client, **body: Any) -> dict[str, Any]:
    return await c._obj("POST", "/v1/uploads", json=body)


async def refused(c: Client, status: int, code: str, **body: Any) -> None:
    with pytest.raises(ApiError) as e:
        await ticket(c, **body)
    assert (e.value.status, e.value.code) == (status, code), e.value


async def pair(make: Make) -> tuple[Client, Client, str]:
    a, b = await make("ua"), await make("ub")
    await befriend(a, b)
    return a, b, single_conv_id(a.user_id or 0, b.user_id or 0)


async def send_file(c: Client, conv: str, upload_id: str, ctype: str = "file", **extra: Any) -> int:
    ack = await c.send_rest(conv, {"upload_id": upload_id, **extra}, ctype)
    assert ack["ok"] is True, ack
    return int(ack["seq"])


async def link(c: Client, upload_id: str, thumbnail: bool = False) -> Response:
    path = f"/v1/uploads/{upload_id}" + ("/thumbnail" if thumbnail else "")
    return await c.http.get(
        c.base_url + path, headers={"Authorization": f"Bearer {c.token}"}, follow_redirects=False
    )


async def test_a_file_goes_to_the_store_and_reaches_the_peer(make: Make) -> None:
    a, b, conv = await pair(make)
    data = b"%PDF-1.7 " + uuid.uuid4().bytes * 100
    t = await ticket(
        a, content_type="application/pdf", size=len(data), filename="../notes/plan.pdf"
    )
    assert t["method"] == "PUT" and t["upload_id"] and t["expires_at"] > 0
    r = await a.http.put(t["url"], content=data, headers=t["headers"])
    assert r.status_code == 200, r.text
    seq = await send_file(a, conv, t["upload_id"], caption="the plan", name="ignored", size=1)
    await persisted(a, conv, seq)
    [m] = (await b.history(conv, seq, seq))["messages"]
    assert m["content_type"] == "file"
    assert m["content"] == {
        "upload_id": t["upload_id"],
        "name": "plan.pdf",  # no folders; what the client claims besides is not kept
        "size": len(data),
        "mime": "application/pdf",
        "caption": "the plan",
    }
    got = await link(b, t["upload_id"])
    assert got.status_code == 302 and "private" in got.headers["cache-control"]
    assert await b.download(t["upload_id"]) == data
    assert await a.download(t["upload_id"]) == data
    # ?redirect=false answers the URL as JSON
    j = await b._obj("GET", f"/v1/uploads/{t['upload_id']}", params={"redirect": "false"})
    assert set(j) == {"url", "expires_at"}
    assert (await b.http.get(j["url"])).content == data


async def test_an_image_gets_its_dimensions_and_a_thumbnail(make: Make) -> None:
    a, b, conv = await pair(make)
    up = await a.upload(jpeg(1600, 900), "image/jpeg", "beach.jpg")
    seq = await send_file(a, conv, up, "image")
    await persisted(a, conv, seq)
    [m] = (await b.history(conv, seq, seq))["messages"]
    assert m["content"] == {
        "upload_id": up,
        "name": "beach.jpg",
        "size": m["content"]["size"],
        "mime": "image/jpeg",
        "width": 1600,
        "height": 900,
    }

    async def thumb() -> bytes | None:
        try:
            return await b.download(up, thumbnail=True)
        except ApiError as e:
            assert e.status == 404
            return None

    data = await eventually(thumb, timeout=20)
    img = Image.open(io.BytesIO(data))
    assert img.format == "JPEG" and img.size == (320, 180)


async def test_limits_and_bad_declarations_are_refused(make: Make) -> None:
    a = await make("lim")
    await refused(a, 413, "too_large", content_type="video/mp4", size=100 * 1024 * 1024 + 1)
    await refused(a, 400, "bad_request", content_type="image/jpeg", size=0)
    await refused(a, 400, "bad_request", content_type="Image/JPEG", size=10)
    await refused(a, 400, "bad_request", content_type="image/jpeg; q=1", size=10)
    await refused(a, 400, "bad_request", content_type="jpeg", size=10)
    await refused(a, 400, "bad_request", content_type="image/jpeg", size="10")
    await refused(a, 400, "bad_request", content_type="image/jpeg", size=10, filename="/")
    await refused(a, 400, "bad_request", content_type="image/jpeg", size=10, filename="x" * 256)
    await refused(a, 422, "bad_request", size=10)


async def test_a_send_must_name_my_stored_upload_with_its_size(make: Make) -> None:
    a, b, conv = await pair(make)
    mine = await a.upload(b"hello", "text/plain", "a.txt")
    theirs = await b.upload(b"theirs", "text/plain", "b.txt")
    pending = (await ticket(a, content_type="text/plain", size=3))["upload_id"]
    for content, ctype in [
        ({"upload_id": theirs}, "file"),  # not mine
        ({"upload_id": pending}, "file"),  # no bytes yet
        ({"upload_id": "A" * 22}, "file"),  # unknown
        ({"upload_id": mine}, "image"),  # not an image type
        ({"upload_id": "short"}, "file"),  # malformed
        ({}, "file"),
        ({"upload_id": mine, "caption": 5}, "file"),
        ({"upload_id": mine, "caption": "x" * 4097}, "file"),
    ]:
        with pytest.raises(ApiError) as e:
            await a.send_rest(conv, content, ctype)
        assert (e.value.status, e.value.code) == (400, "bad_request"), (content, ctype, e.value)
    # nothing was sent: the next message is the first
    seq = await send_file(a, conv, mine)
    await persisted(b, conv, seq)
    [m] = (await b.history(conv))["messages"]
    assert m["content"]["upload_id"] == mine


async def test_garbage_under_an_image_type_is_not_an_image(make: Make) -> None:
    a, _, conv = await pair(make)
    up = await a.upload(b"\x89PNG\r\n\x1a\n" + b"\0" * 500, "image/png", "x.png")
    with pytest.raises(ApiError) as e:
        await a.send_rest(conv, {"upload_id": up}, "image")
    assert e.value.code == "bad_request" and "image" in e.value.message
    # the same bytes go as a file
    assert await send_file(a, conv, up) >= 1


async def test_a_websocket_send_of_a_picture_is_checked_too(make: Make) -> None:
    a, b, conv = await pair(make)
    up = await a.upload(jpeg(64, 48), "image/jpeg")
    ws = await a.connect()
    ack = await ws.send(conv, {"upload_id": up, "caption": "hi"}, "image")
    assert ack["ok"] is True, ack
    await persisted(a, conv, ack["seq"])
    [m] = (await b.history(conv, ack["seq"], ack["seq"]))["messages"]
    assert m["content"]["width"] == 64 and m["content"]["caption"] == "hi"
    bad = await ws.send(conv, {"upload_id": "B" * 22}, "image")
    assert bad["ok"] is False and bad["code"] == "bad_request"


async def test_access_follows_the_windows(make: Make, stores: Stores) -> None:
    """Owner O sends a picture in group G. Member B sees it; C joined later without
    history does not; K kicked after it still does; L cleared history after it does
    not; an outsider Z does not; after a recall only the uploader does. Absent and
    forbidden answer the same 404."""
    o, b, c, k, lm, z = [await make(p) for p in ("o", "b", "c", "k", "l", "z")]
    g = await o.create_group("pics", [u.user_id or 0 for u in (b, k, lm)])
    gid = int(g["group_id"])
    conv = group_conv_id(gid)
    up = await o.upload(jpeg(40, 30), "image/jpeg", "p.jpg")
    seq = await send_file(o, conv, up, "image")
    await persisted(o, conv, seq)
    await o.add_members(gid, [c.user_id or 0], with_history=False)
    await o.kick(gid, k.user_id or 0)
    await lm.clear(conv)

    async def status(u: Client, upload_id: str = up) -> int:
        return (await link(u, upload_id)).status_code

    assert [await status(u) for u in (o, b, k, c, lm, z)] == [302, 302, 302, 404, 404, 404]
    assert await status(z, "C" * 22) == 404 == await status(z, "not-an-id")
    body = (await link(z, up)).json()
    assert body["error"]["code"] == "not_found"
    await o.recall(conv, seq)

    async def recalled() -> bool:
        return await status(b) == 404

    await eventually(recalled)
    assert await status(o) == 302, "the uploader keeps access"


async def test_an_edit_changes_the_caption_and_keeps_the_upload(make: Make) -> None:
    a, b, conv = await pair(make)
    up = await a.upload(b"report", "text/plain", "r.txt")
    other = await a.upload(b"other", "text/plain", "o.txt")
    seq = await send_file(a, conv, up, caption="v1")
    await persisted(a, conv, seq)
    await a.edit(conv, seq, {"upload_id": up, "caption": "v2"})
    [m] = (await b.history(conv, seq, seq))["messages"]
    assert m["content"] == {
        "upload_id": up,
        "name": "r.txt",
        "size": 6,
        "mime": "text/plain",
        "caption": "v2",
    }
    with pytest.raises(ApiError) as e:
        await a.edit(conv, seq, {"upload_id": other})
    assert e.value.code == "bad_request"
    # the other upload was never sent: the peer cannot fetch it
    assert (await link(b, other)).status_code == 404


async def test_a_stored_message_records_its_upload(make: Make, stores: Stores) -> None:
    a, _, conv = await pair(make)
    up = await a.upload(b"x", "text/plain")
    seq = await send_file(a, conv, up)
    await persisted(a, conv, seq)
    async with pg(stores) as db:
        rows = await db.fetch("SELECT conv_id, seq FROM message_uploads WHERE upload_id = $1", up)
        sent = await db.fetchval("SELECT sent_at FROM uploads WHERE upload_id = $1", up)
    assert [(r["conv_id"], r["seq"]) for r in rows] == [(conv, seq)]
    assert sent is not None


async def test_a_decompression_bomb_is_refused_at_the_send(make: Make) -> None:
    """A few KB that declare 10 gigapixels: refused from the header, never decoded; the
    server goes on serving."""
    a, b, conv = await pair(make)
    bomb = png_bomb(100_000, 100_000)
    up = await a.upload(bomb, "image/png", "bomb.png")
    with pytest.raises(ApiError) as e:
        await a.send_rest(conv, {"upload_id": up}, "image")
    assert e.value.code == "bad_request" and "pixels" in e.value.message
    assert (await a.send_rest(conv, "still here"))["ok"] is True
    # sent as a plain file it is just bytes: no thumbnail is ever tried
    seq = await send_file(a, conv, up)
    await persisted(a, conv, seq)
    assert await b.download(up) == bomb
    with pytest.raises(ApiError) as e:
        await b.download(up, thumbnail=True)
    assert e.value.status == 404


async def test_a_file_on_disk_streams_in_chunks_and_one_too_large_is_refused_unread(
    make: Make, tmp_path: Path
) -> None:
    a, b, conv = await pair(make)
    big = tmp_path / "big.bin"
    data = os.urandom(UPLOAD_CHUNK * 2 + 1000)
    big.write_bytes(data)
    seen: list[tuple[int, int]] = []
    up = await a.upload_file(
        big, "application/octet-stream", on_progress=lambda s, t: seen.append((s, t))
    )
    assert seen == [
        (UPLOAD_CHUNK, len(data)),
        (2 * UPLOAD_CHUNK, len(data)),
        (len(data), len(data)),
    ]
    seq = await send_file(a, conv, up)
    await persisted(b, conv, seq)
    [m] = (await b.history(conv))["messages"]
    assert (m["content"]["name"], m["content"]["size"]) == ("big.bin", len(data))
    assert await b.download(up) == data
    # over the limit: refused on the declared size, before a byte is read or sent
    huge = tmp_path / "huge.bin"
    with huge.open("wb") as f:
        f.truncate(100 * 1024 * 1024 + 1)  # sparse: nothing on disk
    with pytest.raises(ApiError) as e:
        await a.upload_file(
            huge, "application/octet-stream", on_progress=lambda s, t: seen.append((s, t))
        )
    assert (e.value.status, e.value.code) == (413, "too_large") and len(seen) == 3
