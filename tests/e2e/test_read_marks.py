"""Honest read marks: only what was on screen in a visible, focused window is marked read.
A chat opens at its first unread message under a "New messages" line; while scrolled up,
new messages stay unread and a button counts them and jumps to the latest; a message
that comes while the window is not focused stays unread until it is. Both sizes."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, message, shot, uname
from tests.support import PASSWORD, befriend, eventually

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=10_000)

SETTLE_S = 1.5  # longer than the page's read-report batching (250 ms) by far


async def read_seq(c: Client, conv: str) -> int:
    return int({s["conv_id"]: s for s in await c.conversations()}[conv]["read_seq"])


async def unread(c: Client, conv: str) -> int:
    return int({s["conv_id"]: s for s in await c.conversations()}[conv]["unread"])


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_only_what_was_on_screen_is_read(
    server: Any, new_page: Any, shots: Path, size: tuple[int, int]
) -> None:
    url = server.url
    alice = uname("alice")
    me = await Client.register(url, alice, PASSWORD)  # alice's other device, to look
    bob = await Client.register(url, uname("bob"), PASSWORD)
    conv = await befriend(me, bob)
    try:
        for i in range(1, 11):
            await bob.send_rest(conv, f"old {i}")
        await me.read_rest(conv, 10)
        for i in range(1, 41):
            await bob.send_rest(conv, f"unread {i}")
        await eventually(lambda: unread(me, conv), timeout=10)

        page = await new_page("alice", width=size[0], height=size[1])
        await log_in(page, alice, url=url)
        await conv_item(page, bob.username or "").click()

        # opened at the first unread message, under the line; the newest is off screen
        line = page.get_by_test_id("new-divider")
        await expect(line).to_be_visible()
        await expect(line).to_have_text("New messages")
        await expect(message(page, "unread 1")).to_be_in_viewport()
        await expect(message(page, "unread 40")).not_to_be_in_viewport()
        following = await line.evaluate(
            "(el) => el.nextElementSibling.querySelector('[data-testid=message-text]').textContent"
        )
        assert following == "unread 1"
        await asyncio.sleep(SETTLE_S)
        seen = await read_seq(me, conv)
        assert 10 < seen < 50, f"read up to {seen}: only rows on screen count"
        jump = page.get_by_test_id("jump-latest")
        await expect(jump).to_be_visible()
        await expect(jump.get_by_test_id("jump-count")).to_have_text(re.compile(r"^\d+ new$"))
        await shot(page, shots, f"61-new-messages-{size[0]}")

        # the button jumps to the latest: everything is read
        await jump.click()
        await expect(message(page, "unread 40")).to_be_in_viewport()
        await eventually(lambda: _is(read_seq(me, conv), 50), timeout=10)
        await expect(jump).to_be_hidden()

        # scrolled far up: a new message is not read, the button counts it
        await page.get_by_test_id("messages").evaluate("(el) => { el.scrollTop = 0; }")
        await bob.send_rest(conv, "while you were up there")
        await expect(jump.get_by_test_id("jump-count")).to_have_text("1 new")
        await asyncio.sleep(SETTLE_S)
        assert await read_seq(me, conv) == 50
        await jump.click()
        await eventually(lambda: _is(read_seq(me, conv), 51), timeout=10)

        # at the bottom, but the window is not focused: not read until it is
        await page.evaluate(
            "() => { document.hasFocus = () => false; window.dispatchEvent(new Event('blur')); }"
        )
        await bob.send_rest(conv, "while you were away")
        await expect(message(page, "while you were away")).to_be_visible()
        await asyncio.sleep(SETTLE_S)
        assert await read_seq(me, conv) == 51
        await page.evaluate(
            "() => { delete document.hasFocus; window.dispatchEvent(new Event('focus')); }"
        )
        await eventually(lambda: _is(read_seq(me, conv), 52), timeout=10)
        assert await unread(me, conv) == 0
    finally:
        for c in (me, bob):
            await c.aclose()


async def _is(value: Any, expected: int) -> bool:
    return await value == expected
