"""Escape closes the innermost open thing only: the reaction picker, then the members
panel, then the chat (before, Escape in the picker closed the chat). Both sizes."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_escape_closes_the_innermost_thing(
    server: Any, new_page: Any, size: tuple[int, int]
) -> None:
    url = server.url
    alice, bob = uname("alice"), uname("bob")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, bob, PASSWORD)
    await befriend(a, b)
    g = await a.create_group("escape", [b.user_id])
    seq = (await b.send_rest(g["conv_id"], "react to me"))["seq"]
    page = await new_page("alice", width=size[0], height=size[1])
    await log_in(page, alice, url=url)
    await conv_item(page, "escape").click()
    title = page.get_by_test_id("chat-title")
    await expect(title).to_have_text("escape")
    row = page.locator(f'[data-testid="message"][data-seq="{seq}"]')
    await row.hover()
    await row.get_by_test_id("react-btn").click()
    picker = row.get_by_test_id("reaction-picker")
    await expect(picker).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(picker).to_be_hidden()
    await expect(title).to_have_text("escape")  # the chat stays
    await page.get_by_test_id("group-info-btn").click()
    panel = page.get_by_test_id("group-panel")
    await expect(panel).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(panel).to_be_hidden()
    await expect(title).to_have_text("escape")
    await page.keyboard.press("Escape")
    await expect(title).to_be_hidden()
    for c in (a, b):
        await c.aclose()
