"""Pictures and files in the web client, in a real browser against a real ``im-server
serve`` and its object store (another origin: CORS and the page's CSP both in play).
Alice sends from her browser (the file picker, a paste, a drop); Bob sees the bubbles in
his, opens the picture and downloads the file. An upload the server refuses shows a
toast and sends nothing.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from im_server.config import Settings
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend, eventually

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=15_000)

# thumbnails are made after the send: the page asks again (404) until one is there
THUMB_NOT_YET = (404, "/v1/uploads/")


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def attachments(page: Any) -> Any:
    return page.locator('[data-testid="message"]').filter(has=page.get_by_test_id("attachment"))


async def loaded(img: Any) -> int:
    """The picture's natural width once it has loaded."""
    handle = await img.element_handle()
    await img.page.wait_for_function("(i) => i.complete && i.naturalWidth > 0", arg=handle)
    width: int = await img.evaluate("(i) => i.naturalWidth")
    return width


async def history(client: Client, conv: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = (await client.history(conv, limit=50))["messages"]
    return msgs


async def open_chat(url: str, new_page: Any, names: dict[str, str], who: str, peer: str) -> Any:
    page = await new_page(who, http_errors=[THUMB_NOT_YET])
    await log_in(page, names[who], url=url)
    await conv_item(page, names[peer]).click()
    await expect(page.get_by_test_id("chat-title")).to_have_text(names[peer])
    return page


@pytest.fixture
async def two(server: Any) -> Any:
    names = {k: uname(k) for k in ("alice", "bob")}
    alice_c = await Client.register(server.url, names["alice"], PASSWORD)
    bob_c = await Client.register(server.url, names["bob"], PASSWORD)
    conv = await befriend(alice_c, bob_c)
    try:
        yield names, bob_c, conv
    finally:
        await alice_c.aclose()
        await bob_c.aclose()


async def test_picture_and_file(server: Any, new_page: Any, shots: Path, two: Any) -> None:
    names, bob_c, conv = two
    alice = await open_chat(server.url, new_page, names, "alice", "bob")
    bob = await open_chat(server.url, new_page, names, "bob", "alice")

    # a picture from the file picker, the composer's text as its caption
    picture = png(640, 480, (30, 140, 90))
    await alice.get_by_test_id("composer").fill("the <b>view</b> from here")
    await alice.get_by_test_id("file-input").set_input_files(
        files=[{"name": "view.png", "mimeType": "image/png", "buffer": picture}]
    )
    mine = attachments(alice).last
    await expect(mine).to_have_attribute("data-seq", re.compile(r"\d+"))
    await expect(alice.get_by_test_id("composer")).to_have_value("")
    assert await loaded(mine.get_by_test_id("attachment-thumb")) == 640

    theirs = attachments(bob).last
    await expect(theirs.get_by_test_id("message-text")).to_have_text("the <b>view</b> from here")
    box = theirs.get_by_test_id("attachment-image")
    # the box is reserved from the content's size (640 x 480 into 280 px) before it loads
    assert await box.evaluate("(b) => [b.style.width, b.style.height]") == ["280px", "210px"]
    thumb_width = await loaded(theirs.get_by_test_id("attachment-thumb"))
    assert 0 < thumb_width <= 320  # the thumbnail, not the original
    await shot(bob, shots, "attachments-1-picture")

    stored = [m for m in await history(bob_c, conv) if m["content_type"] == "image"]
    assert len(stored) == 1
    content = stored[0]["content"]
    assert content["name"] == "view.png" and content["size"] == len(picture)
    assert (content["width"], content["height"]) == (640, 480)
    assert content["caption"] == "the <b>view</b> from here"

    # a click opens the full picture; Esc closes it and leaves the chat open
    await box.click()
    lightbox = bob.get_by_test_id("lightbox")
    await expect(lightbox).to_be_visible()
    await expect(bob.get_by_test_id("lightbox-caption")).to_have_text("the <b>view</b> from here")
    assert await loaded(bob.get_by_test_id("lightbox-img")) == 640
    await shot(bob, shots, "attachments-2-lightbox")
    await bob.keyboard.press("Escape")
    await expect(lightbox).to_be_hidden()
    await expect(bob.get_by_test_id("chat-title")).to_have_text(names["alice"])

    # a file: a name that looks like markup stays text; the peer downloads the bytes
    name = "<img src=x onerror=window.__pwned=1>notes.txt"
    data = bytes(range(256)) * 11 + b"end"  # 2819 bytes
    await alice.get_by_test_id("file-input").set_input_files(
        files=[{"name": name, "mimeType": "text/plain", "buffer": data}]
    )
    card = attachments(bob).last.get_by_test_id("attachment-file")
    await expect(card.get_by_test_id("attachment-name")).to_have_text(name)
    await expect(card.get_by_test_id("attachment-size")).to_have_text("2.8 KB")
    assert await bob.evaluate("window.__pwned") is None
    await expect(attachments(alice).last.get_by_test_id("attachment-name")).to_have_text(name)
    await shot(bob, shots, "attachments-3-file")
    async with bob.expect_download() as info:
        await card.click()
    download = await info.value
    assert download.suggested_filename.endswith("notes.txt")
    path = await download.path()
    assert await asyncio.to_thread(Path(path).read_bytes) == data
    # the page stayed where it was
    await expect(bob.get_by_test_id("chat-title")).to_have_text(names["alice"])


# a picture made in the page, put in a DataTransfer and given to a paste or drop event
DISPATCH = """async ([kind, color]) => {
  const canvas = document.createElement('canvas');
  canvas.width = 300; canvas.height = 600;
  const g = canvas.getContext('2d');
  g.fillStyle = color; g.fillRect(0, 0, 300, 600);
  const blob = await new Promise((r) => canvas.toBlob(r, 'image/png'));
  const dt = new DataTransfer();
  dt.items.add(new File([blob], kind === 'paste' ? 'image.png' : 'dropped.png', { type: 'image/png' }));
  if (kind === 'paste') {
    const box = document.querySelector('[data-testid="composer"]');
    box.focus();
    box.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
  } else {
    const target = document.querySelector('[data-testid="messages"]');
    for (const type of ['dragenter', 'dragover', 'drop']) {
      target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
    }
  }
}"""


async def test_paste_and_drop_send_pictures(
    server: Any, new_page: Any, shots: Path, two: Any
) -> None:
    names, bob_c, conv = two
    alice = await open_chat(server.url, new_page, names, "alice", "bob")
    bob = await open_chat(server.url, new_page, names, "bob", "alice")

    # the first upload is held at the store's door: a pending bubble with its progress bar
    release = asyncio.Event()

    async def hold(route: Any) -> None:
        await release.wait()
        await route.continue_()

    await alice.route(lambda u: "X-Amz-Signature" in u, hold)
    await alice.evaluate(DISPATCH, ["paste", "#d04040"])
    pending = alice.locator('[data-testid="message"][data-status="uploading"]')
    await expect(pending.get_by_test_id("upload-progress")).to_be_visible()
    assert await loaded(pending.get_by_test_id("attachment-thumb")) == 300  # from memory
    await shot(alice, shots, "attachments-4-uploading")
    release.set()
    await expect(pending).to_have_count(0)
    await alice.unroute_all()
    await expect(attachments(bob)).to_have_count(1)
    await alice.get_by_test_id("composer").fill("dropped in")
    await alice.evaluate(DISPATCH, ["drop", "#4060d0"])
    await expect(attachments(bob)).to_have_count(2)
    await expect(attachments(bob).last.get_by_test_id("message-text")).to_have_text("dropped in")
    for i in range(2):
        assert await loaded(attachments(bob).nth(i).get_by_test_id("attachment-thumb")) > 0
    # a tall picture: 300 x 600 into 280 px high
    size = (
        await attachments(bob)
        .last.get_by_test_id("attachment-image")
        .evaluate("(b) => [b.style.width, b.style.height]")
    )
    assert size == ["140px", "280px"]
    await expect(alice.locator("#chat-view")).not_to_have_class(re.compile("dropping"))
    await shot(bob, shots, "attachments-5-paste-drop")

    async def both() -> list[str] | None:
        names_ = [m["content"]["name"] for m in await history(bob_c, conv)]
        return names_ if len(names_) == 2 else None

    assert await eventually(both) == ["image.png", "dropped.png"]


async def test_refused_uploads_show_a_toast(
    server: Any, new_page: Any, shots: Path, two: Any
) -> None:
    names, bob_c, conv = two
    limit = Settings.model_fields["upload_max_bytes"].default  # the suite's server keeps it
    alice = await new_page("alice", http_errors=[(413, "/v1/uploads"), (503, "/"), THUMB_NOT_YET])
    await log_in(alice, names["alice"], url=server.url)
    await conv_item(alice, names["bob"]).click()

    # over the limit: the server says so before any byte is sent (the file is only a size)
    await alice.get_by_test_id("composer").fill("too big to send")
    await alice.evaluate(
        """(size) => {
          const dt = new DataTransfer();
          dt.items.add(new File([new Uint8Array(size)], 'huge.bin', { type: 'application/zip' }));
          document.querySelector('[data-testid="messages"]').dispatchEvent(
            new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
        }""",
        limit + 1,
    )
    toast = alice.locator("#toast")
    await expect(toast).to_be_visible()
    await expect(toast).to_contain_text("huge.bin")
    await expect(toast).to_contain_text("limit")
    await shot(alice, shots, "attachments-6-too-large")
    await expect(attachments(alice)).to_have_count(0)
    # its caption is back in the composer, not lost
    await expect(alice.get_by_test_id("composer")).to_have_value("too big to send")

    # the object store fails the PUT: a toast again, the pending bubble goes, nothing sent
    async def store_down(route: Any) -> None:
        await route.fulfill(status=503, body="SlowDown")

    await alice.route(lambda u: "X-Amz-Signature" in u, store_down)
    await alice.get_by_test_id("file-input").set_input_files(
        files=[{"name": "report.pdf", "mimeType": "application/pdf", "buffer": b"%PDF-1.4 x"}]
    )
    await expect(toast).to_contain_text("report.pdf")
    await expect(toast).to_contain_text("HTTP 503")
    await expect(attachments(alice)).to_have_count(0)
    assert [m for m in await history(bob_c, conv) if m["content_type"] in ("image", "file")] == []
