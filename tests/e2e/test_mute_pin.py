"""Mute and pin in the web client, in a real browser against a real ``im-server serve``:
bob has two devices (two pages of one user), alice writes from ``im_server.client.Client``.
Pinning moves a conversation to the top (and unpinning back), a muted conversation shows
its icon and its unread leaves the badge while a mention in it still counts, the other
device follows through sync, and the page title's badge equals ``GET /v1/unread``'s.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, eventually

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

TITLE = "im-server · chat"


def titles(page: Any) -> Any:
    return page.get_by_test_id("conv-item").get_by_test_id("conv-title")


async def badge_is(pages: list[Any], client: Client, n: int) -> None:
    """Every page's title shows ``n`` (none when 0), as its store computes it, and the
    server's ``badge`` is ``n`` too."""
    for page in pages:
        await expect(page).to_have_title(f"({n}) {TITLE}" if n else TITLE)
        assert await page.evaluate("window.__im.store.badge()") == n

    async def server() -> bool:
        return (await client.unread())["badge"] == n

    await eventually(server)


async def test_mute_pin_and_the_title_badge(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob")}
    alice = await Client.register(url, names["alice"], PASSWORD)
    bob_c = await Client.register(url, names["bob"], PASSWORD)  # bob's REST view
    try:
        bob_id = bob_c.user_id
        assert bob_id is not None
        g1 = (await alice.create_group("Garden", [bob_id]))["conv_id"]
        g2 = (await alice.create_group("Kitchen", [bob_id]))["conv_id"]
        await alice.send_rest(g1, {"text": "seeds arrived"})
        await alice.send_rest(g2, {"text": "oven is fixed"})  # newest: Kitchen on top

        phone = await new_page("bob-phone")
        laptop = await new_page("bob-laptop")
        await log_in(phone, names["bob"], url=url)
        await log_in(laptop, names["bob"], url=url)
        for page in (phone, laptop):
            await expect(titles(page)).to_have_text(["Kitchen", "Garden"])
        await badge_is([phone, laptop], bob_c, 2)

        # -- pin: Garden goes to the top on both devices, unpin puts it back -------------
        await conv_item(phone, "Garden").click()
        await expect(phone.get_by_test_id("chat-title")).to_have_text("Garden")
        await badge_is([phone, laptop], bob_c, 1)  # opening read it
        pin = phone.get_by_test_id("pin-btn")
        await expect(pin).to_have_text("Pin")
        await pin.click()
        await expect(pin).to_have_text("Unpin")
        await expect(pin).to_have_attribute("aria-pressed", "true")
        for page in (phone, laptop):
            await expect(titles(page)).to_have_text(["Garden", "Kitchen"])
            await expect(conv_item(page, "Garden").get_by_test_id("pinned-icon")).to_be_visible()
        assert [c["conv_id"] for c in await bob_c.conversations()] == [g1, g2]
        await shot(phone, shots, "60-pin-button")
        await shot(laptop, shots, "60-pinned-on-other-device")
        # a newer message elsewhere does not move a pinned conversation down
        await alice.send_rest(g2, {"text": "dinner at 8"})
        await expect(conv_item(laptop, "Kitchen").get_by_test_id("unread-badge")).to_have_text("2")
        await expect(titles(laptop)).to_have_text(["Garden", "Kitchen"])
        await pin.click()
        await expect(pin).to_have_text("Pin")
        for page in (phone, laptop):
            await expect(titles(page)).to_have_text(["Kitchen", "Garden"])
            await expect(conv_item(page, "Garden").get_by_test_id("pinned-icon")).to_be_hidden()
        assert (await bob_c.conversation_settings(g1))["pinned"] is False

        # -- mute: the icon, a dimmed count, and no share of the badge ---------------------
        await conv_item(phone, "Kitchen").click()
        await expect(phone.get_by_test_id("chat-title")).to_have_text("Kitchen")
        await badge_is([phone, laptop], bob_c, 0)
        mute = phone.get_by_test_id("mute-btn")
        await expect(mute).to_have_text("Mute")
        await mute.click()
        await expect(mute).to_have_text("Unmute")
        await expect(mute).to_have_attribute("aria-pressed", "true")
        await phone.get_by_test_id("chat-close").click()
        for page in (phone, laptop):
            item = conv_item(page, "Kitchen")
            await expect(item.get_by_test_id("muted-icon")).to_be_visible()
            await expect(item).to_have_attribute("data-muted", "true")
        assert (await bob_c.conversation_settings(g2))["muted"] is True

        await alice.send_rest(g2, {"text": "who took the ladle"})
        await alice.send_rest(g2, {"text": "never mind"})
        await alice.send_rest(g1, {"text": "tomatoes are red"})
        for page in (phone, laptop):
            await expect(conv_item(page, "Kitchen").get_by_test_id("unread-badge")).to_have_text(
                "2"
            )
            await expect(conv_item(page, "Garden").get_by_test_id("unread-badge")).to_have_text("1")
        await badge_is([phone, laptop], bob_c, 1)  # Garden only: Kitchen is muted
        assert (await bob_c.unread())["total"] == 3
        await shot(laptop, shots, "61-muted-dimmed")

        # a mention breaks through the mute
        await alice.send_rest(g2, {"text": f"@{names['bob']} the ladle?"}, mentions=[bob_id])
        for page in (phone, laptop):
            item = conv_item(page, "Kitchen")
            await expect(item.get_by_test_id("unread-badge")).to_have_text("3")
            await expect(item.get_by_test_id("mention-badge")).to_be_visible()
        await badge_is([phone, laptop], bob_c, 2)
        await laptop.reload()  # the same from the server's state (muted, mention_unread)
        await expect(conv_item(laptop, "Kitchen").get_by_test_id("muted-icon")).to_be_visible()
        await badge_is([phone, laptop], bob_c, 2)
        await shot(laptop, shots, "62-mention-through-mute")

        # -- unmute on the other device: the phone follows, Kitchen counts in full ---------
        await conv_item(laptop, "Garden").click()  # reads Garden
        await expect(laptop.get_by_test_id("chat-title")).to_have_text("Garden")
        await badge_is([phone, laptop], bob_c, 1)
        await conv_item(laptop, "Kitchen").click()  # open it to reach the button
        await expect(laptop.get_by_test_id("chat-title")).to_have_text("Kitchen")
        await laptop.get_by_test_id("mute-btn").click()
        await expect(laptop.get_by_test_id("mute-btn")).to_have_text("Mute")
        await laptop.get_by_test_id("chat-close").click()
        for page in (phone, laptop):
            await expect(conv_item(page, "Kitchen").get_by_test_id("muted-icon")).to_be_hidden()
        await alice.send_rest(g2, {"text": "found it"})
        await badge_is([phone, laptop], bob_c, 1)
        await expect(conv_item(phone, "Kitchen").get_by_test_id("unread-badge")).to_have_text("1")
    finally:
        for c in (alice, bob_c):
            await c.aclose()
