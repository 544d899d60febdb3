"""Links in messages (issue: "links are plain text"): http and https URLs become links
that open in a new tab without handing it this page; no other scheme ever becomes one,
and the text around stays text (a mention included). Both sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

TEXT = (
    "see https://example.com/a?b=1&c=2. and (http://example.org/x) "
    "but not javascript:alert(1) nor ftp://files.example nor data:text/html,hi "
    "nor https://<b>bold</b>"
)


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_http_urls_become_safe_links(
    server: Any, new_page: Any, shots: Path, size: tuple[int, int]
) -> None:
    url = server.url
    alice, bob = uname("alice"), uname("bob")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, bob, PASSWORD)
    conv = await befriend(a, b)
    await b.send_rest(conv, TEXT)
    page = await new_page("alice", width=size[0], height=size[1])
    await log_in(page, alice, url=url)
    await conv_item(page, bob).click()
    links = page.get_by_test_id("msg-link")
    await expect(links).to_have_count(2)
    hrefs = [await links.nth(i).get_attribute("href") for i in range(2)]
    assert hrefs == ["https://example.com/a?b=1&c=2", "http://example.org/x"]
    for i in range(2):
        assert await links.nth(i).get_attribute("target") == "_blank"
        assert await links.nth(i).get_attribute("rel") == "noopener noreferrer"
    text = page.get_by_test_id("message-text").filter(has=links.first)
    assert await text.inner_text() == TEXT  # every character shown, as text
    assert await page.locator(".text b").count() == 0  # no markup from a message
    await shot(page, shots, f"links-{'desktop' if size[0] > 400 else 'phone'}")
    await a.aclose()
    await b.aclose()
