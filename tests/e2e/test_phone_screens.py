"""Every screen usable from 360 px wide: the login, the chat list with friend requests,
a single chat, a group with its members panel, search, the add-friend, new-group and
devices dialogs. On each: no horizontal scroll, and every control on screen is at least
44 px tall and wide (text fields: tall) and inside the width. And the composer stays
above the on-screen keyboard (the layout viewport shrinks: ``interactive-widget``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=10_000)

WIDTH, HEIGHT = 360, 640
KEYBOARD_UP_HEIGHT = 330  # what is left of a 640 px screen under an on-screen keyboard

# every control a finger needs, as on screen now; inline links in message text are
# exempt (their size is the text's, as on every phone)
SMALL_TARGETS = """(width) => {
  const out = [];
  const sel = 'button, input:not([type=hidden]), textarea, select, [role=option], [role=button], a.btn';
  for (const el of document.querySelectorAll(sel)) {
    // a checkbox's target is its label, when the label holds it
    const box = (el.matches('[type=checkbox], [type=radio]') && el.closest('label')) || el;
    const r = box.getBoundingClientRect();
    if (!r.width || !r.height) continue;                       // not rendered
    const cs = getComputedStyle(el);
    if (cs.visibility === 'hidden' || el.closest('[hidden]')) continue;
    if (r.bottom < 0 || r.top > innerHeight) continue;         // scrolled out of view
    const name = el.dataset.testid || el.id || el.getAttribute('aria-label') || el.tagName;
    const field = box.matches('input, textarea, select, label');
    if (r.left < -0.5 || r.right > width + 0.5) out.push(`${name}: off screen (${r.left}..${r.right})`);
    if (el.matches('button') && el.scrollWidth > el.clientWidth + 1) out.push(`${name}: its text is cut`);
    if (r.height < 43.5 || (!field && r.width < 43.5)) out.push(`${name}: ${r.width.toFixed(0)}x${r.height.toFixed(0)}`);
  }
  return out;
}"""


async def check(page: Any, where: str, problems: list[str]) -> None:
    wide = await page.evaluate("document.documentElement.scrollWidth")
    if wide > WIDTH:
        problems.append(f"{where}: the page is {wide} px wide")
    problems.extend(f"{where}: {p}" for p in await page.evaluate(SMALL_TARGETS, WIDTH))


async def test_every_screen_fits_360_px(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    alice = uname("alice")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, uname("bob"), PASSWORD)
    c = await Client.register(url, uname("carol"), PASSWORD)
    problems: list[str] = []
    try:
        conv = await befriend(a, b)
        await b.send_rest(conv, "a long line of text to wrap " * 6 + " https://example.com/x")
        seq = (await b.send_rest(conv, "react to me"))["seq"]
        g = await a.create_group("A group with quite a long name indeed", [b.user_id, c.user_id])
        await b.send_rest(g["conv_id"], "hello group")
        await c.request_friend(a.user_id, "hi")  # type: ignore[arg-type]
        page = await new_page("alice", width=WIDTH, height=HEIGHT)
        await page.goto(url + "/")
        await expect(page.get_by_test_id("auth-screen")).to_be_visible()
        await check(page, "login", problems)

        await log_in(page, alice)
        await expect(page.get_by_test_id("incoming-request")).to_be_visible()
        await check(page, "chat list", problems)
        await shot(page, shots, "phone-360-list")

        await conv_item(page, b.username or "").click()
        row = page.locator(f'[data-testid="message"][data-seq="{seq}"]')
        await expect(row).to_be_visible()
        await check(page, "single chat", problems)
        await row.get_by_test_id("message-text").click()  # a tap shows its actions
        await row.get_by_test_id("react-btn").click()
        await expect(row.get_by_test_id("reaction-picker")).to_be_visible()
        await check(page, "reaction picker", problems)
        await shot(page, shots, "phone-360-chat")
        await page.keyboard.press("Escape")

        # the on-screen keyboard: the composer stays in view, above it
        composer = page.get_by_test_id("composer")
        await composer.focus()
        await page.set_viewport_size({"width": WIDTH, "height": KEYBOARD_UP_HEIGHT})
        box = await composer.bounding_box()
        assert box is not None and box["y"] >= 0, box
        assert box["y"] + box["height"] <= KEYBOARD_UP_HEIGHT, (
            f"the composer is under the keyboard: {box}"
        )
        await expect(page.get_by_test_id("chat-title")).to_be_in_viewport()
        await check(page, "chat under the keyboard", problems)
        await shot(page, shots, "phone-360-keyboard")
        await page.set_viewport_size({"width": WIDTH, "height": HEIGHT})

        await page.get_by_test_id("chat-close").click()
        await conv_item(page, "A group with quite a long name indeed").click()
        await page.get_by_test_id("group-info-btn").click()
        await expect(page.get_by_test_id("member").first).to_be_visible()
        await check(page, "members panel", problems)
        await page.keyboard.press("Escape")
        await page.keyboard.press("Escape")

        await page.get_by_test_id("search-input").fill("hello")
        await expect(page.get_by_test_id("search-result").first).to_be_visible()
        await check(page, "search", problems)
        await page.get_by_test_id("search-input").fill("")

        for opener, dialog in (
            ("add-friend-btn", "friend-dialog"),
            ("new-group-btn", "group-dialog"),
            ("sessions-btn", "sessions-dialog"),
        ):
            await page.get_by_test_id(opener).click()
            await expect(page.get_by_test_id(dialog)).to_be_visible()
            await check(page, dialog, problems)
            await page.keyboard.press("Escape")
            await expect(page.get_by_test_id(dialog)).to_be_hidden()
        assert not problems, "\n".join(problems)
    finally:
        for x in (a, b, c):
            await x.aclose()
