"""Every action by keyboard, focus always visible: log in, reach a chat in the list and
open it, send, move through the messages with the arrow keys, react from the keyboard,
and Escape from the picker back to where it was opened. At each step the focused
element shows an outline (or the inputs' focus ring). Both sizes."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const cs = getComputedStyle(el);
  const ring = (cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) > 0)
    || (cs.boxShadow && cs.boxShadow !== 'none');
  return {testid: el.dataset.testid || el.id || el.tagName, ring};
}"""


async def focused(page: Any) -> dict[str, Any]:
    f = await page.evaluate(FOCUSED)
    assert f is not None, "nothing has the focus"
    assert f["ring"], f"the focus on {f['testid']} is not visible"
    return f


async def tab_to(page: Any, testid: str, *, back: bool = False, limit: int = 40) -> None:
    """Press Tab (Shift+Tab) until ``testid`` has the focus; every stop shows it."""
    for _ in range(limit):
        await page.keyboard.press("Shift+Tab" if back else "Tab")
        if await page.evaluate(FOCUSED) is None:
            continue  # the focus left the page (the browser's own stops)
        if (await focused(page))["testid"] == testid:
            return
    raise AssertionError(f"{testid} not reached by the keyboard in {limit} steps")


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_everything_by_keyboard(server: Any, new_page: Any, size: tuple[int, int]) -> None:
    url = server.url
    alice = uname("alice")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, uname("bob"), PASSWORD)
    conv = await befriend(a, b)
    await b.send_rest(conv, "first from bob")
    await b.send_rest(conv, "second from bob")
    try:
        page = await new_page("alice", width=size[0], height=size[1])
        await page.goto(url + "/")
        await expect(page.get_by_test_id("auth-screen")).to_be_visible()
        await tab_to(page, "auth-username")
        await page.keyboard.type(alice)
        await tab_to(page, "auth-password")
        await page.keyboard.type(PASSWORD)
        await page.keyboard.press("Enter")
        await expect(page.get_by_test_id("offline-banner")).to_be_hidden()
        await expect(page.get_by_test_id("conv-item")).to_have_count(1)

        # the chat list by Tab, a chat opened with Enter
        await tab_to(page, "conv-item")
        await page.keyboard.press("Enter")
        await expect(page.get_by_test_id("chat-title")).to_have_text(b.username or "")
        await tab_to(page, "composer")
        await page.keyboard.type("typed without a mouse")
        await page.keyboard.press("Enter")
        mine = page.locator('[data-testid="message"][data-mine="true"]')
        await expect(mine).to_have_attribute("data-seq", "3")

        # back into the list of messages (its one tab stop: the row last focused, here
        # on the way to the composer), End to the newest, then up with the arrow keys
        await tab_to(page, "message", back=True)
        row = page.locator("#timeline > .msg:focus")
        await expect(row).to_have_count(1)
        await page.keyboard.press("End")
        await expect(row).to_have_attribute("data-seq", "3")
        await page.keyboard.press("ArrowUp")
        await expect(row).to_have_attribute("data-seq", "2")
        await focused(page)
        await page.keyboard.press("Home")
        await expect(row).to_have_attribute("data-seq", "1")
        await page.keyboard.press("ArrowDown")
        await expect(row).to_have_attribute("data-seq", "2")

        # into its actions: React opens the picker on its first emoji; Escape goes back
        target = page.locator('[data-testid="message"][data-seq="2"]')
        await tab_to(page, "react-btn", limit=4)
        await page.keyboard.press("Enter")
        picker = target.get_by_test_id("reaction-picker")
        await expect(picker).to_be_visible()
        assert (await focused(page))["testid"] == "picker-emoji"
        await page.keyboard.press("Escape")
        await expect(picker).to_be_hidden()
        assert (await focused(page))["testid"] == "react-btn"
        await expect(page.get_by_test_id("chat-title")).to_be_visible()  # the chat stays

        # and a reaction, all by keyboard
        await page.keyboard.press("Enter")
        await expect(picker).to_be_visible()
        await page.keyboard.press("Tab")
        await page.keyboard.press("Enter")
        await expect(target.get_by_test_id("reaction-chip")).to_have_count(1)
        assert (await focused(page))["testid"] == "message"
    finally:
        for c in (a, b):
            await c.aclose()
