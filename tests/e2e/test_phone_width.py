"""Phone widths (issue: "phone width breaks the group chat"): at 360 and 375 px wide a
muted, pinned group with a long name fits: no horizontal scroll, the title keeps room,
every header action is on screen and at least 44 px tall and wide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import log_in, shot, uname
from tests.support import PASSWORD

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

HEADER_ACTIONS = ("pin-btn", "mute-btn", "group-info-btn", "chat-close")


@pytest.mark.parametrize("width", [360, 375])
async def test_a_group_header_fits_a_phone(
    server: Any, new_page: Any, shots: Path, width: int
) -> None:
    url = server.url
    alice, bob = uname("alice"), uname("bob")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, bob, PASSWORD)
    g = await a.create_group("Weekend trip to the mountains with everyone", [b.user_id])
    await a.conversation_settings(g["conv_id"], muted=True, pinned=True)
    page = await new_page("alice", width=width, height=812)
    await log_in(page, alice, url=url)
    await page.goto(f"{url}/#/c/{g['conv_id']}")
    title = page.get_by_test_id("chat-title")
    await expect(title).to_have_text("Weekend trip to the mountains with everyone")
    scroll_w = await page.evaluate("document.documentElement.scrollWidth")
    assert scroll_w <= width, f"the page is {scroll_w} px wide at {width}"
    box = await title.bounding_box()
    assert box is not None and box["width"] >= 80, box
    for testid in HEADER_ACTIONS:
        btn = page.get_by_test_id(testid)
        await expect(btn).to_be_visible()
        b_box = await btn.bounding_box()
        assert b_box is not None, testid
        assert b_box["x"] >= 0 and b_box["x"] + b_box["width"] <= width, (testid, b_box)
        assert b_box["width"] >= 44 and b_box["height"] >= 44, (testid, b_box)
    await shot(page, shots, f"phone-{width}-group-header")
    await page.get_by_test_id("group-info-btn").click()
    await expect(page.get_by_test_id("member")).to_have_count(2)
    scroll_w = await page.evaluate("document.documentElement.scrollWidth")
    assert scroll_w <= width
    await a.aclose()
    await b.aclose()
