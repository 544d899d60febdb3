"""Each chat has its own address (``#/c/<conversation id>``): a reload comes back to it,
back and forward move between chats, and an address opened while logged out opens its
chat after login. Both sizes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)


def title(page: Any) -> Any:
    return page.get_by_test_id("chat-title")


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_chats_have_addresses(
    server: Any, new_page: Any, shots: Path, size: tuple[int, int]
) -> None:
    url = server.url
    alice, bob, carol = uname("alice"), uname("bob"), uname("carol")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, bob, PASSWORD)
    c = await Client.register(url, carol, PASSWORD)
    with_bob = await befriend(a, b)
    with_carol = await befriend(a, c)
    page = await new_page("alice", width=size[0], height=size[1])
    await log_in(page, alice, url=url)
    await conv_item(page, bob).click()
    await expect(title(page)).to_have_text(bob)
    assert page.url.endswith(f"#/c/{with_bob}")
    await page.reload()
    await expect(title(page)).to_have_text(bob)  # a reload comes back to the chat
    await page.goto(url + "/")  # the list (phone: the chat is a screen of its own)
    await expect(conv_item(page, carol)).to_be_visible()
    await conv_item(page, carol).click()
    await expect(title(page)).to_have_text(carol)
    assert page.url.endswith(f"#/c/{with_carol}")
    await page.go_back()
    await page.go_back()
    await expect(title(page)).to_have_text(bob)
    await page.go_forward()
    await page.go_forward()
    await expect(title(page)).to_have_text(carol)
    await shot(page, shots, f"chat-address-{'desktop' if size[0] > 400 else 'phone'}")
    # a link opened while logged out: the chat, once logged in
    other = await new_page("alice-elsewhere", width=size[0], height=size[1])
    await other.goto(f"{url}/#/c/{with_bob}")
    await log_in(other, alice)
    await expect(title(other)).to_have_text(bob)
    assert re.search(rf"#/c/{re.escape(with_bob)}$", other.url)
    for cl in (a, b, c):
        await cl.aclose()
