"""Accessibility: axe-core (from npm) finds no serious or critical violation on the login
screen, the chat list, a single chat, a group with its members panel, and the settings
(devices & security), at both sizes; the message list is a live region that a screen
reader announces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=10_000)

BLOCKING = ("serious", "critical")


async def violations(page: Any, where: str) -> list[str]:
    """The serious and critical axe-core violations of what the page shows now (axe is
    put in by an init script: the page's CSP rightly refuses an inline one)."""
    found = await page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
    )
    return [
        f"{where}: {v['id']} ({v['impact']}): {v['help']} at {json.dumps(v['nodes'])}"
        for v in found
        if v["impact"] in BLOCKING
    ]


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_no_serious_axe_violations(
    server: Any, new_page: Any, axe_source: str, size: tuple[int, int]
) -> None:
    url = server.url
    alice = uname("alice")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, uname("bob"), PASSWORD)
    c = await Client.register(url, uname("carol"), PASSWORD)
    try:
        conv = await befriend(a, b)
        await b.send_rest(conv, "hello https://example.com")
        g = await a.create_group("a11y group", [b.user_id, c.user_id])
        await b.send_rest(g["conv_id"], "hi all")
        await c.request_friend(a.user_id, "hi")  # type: ignore[arg-type]
        page = await new_page("alice", width=size[0], height=size[1])
        await page.context.add_init_script(script=axe_source)
        await page.goto(url + "/")
        await expect(page.get_by_test_id("auth-screen")).to_be_visible()
        found = await violations(page, "login")

        await log_in(page, alice)
        await expect(page.get_by_test_id("incoming-request")).to_be_visible()
        found += await violations(page, "chat list")

        await conv_item(page, b.username or "").click()
        await expect(page.get_by_test_id("message")).to_have_count(1)
        found += await violations(page, "single chat")
        # the message list is announced
        log = page.locator("#timeline")
        assert await log.get_attribute("role") == "log"
        assert await log.get_attribute("aria-live") == "polite"

        await page.get_by_test_id("chat-close").click()
        await conv_item(page, "a11y group").click()
        await page.get_by_test_id("group-info-btn").click()
        await expect(page.get_by_test_id("group-panel")).to_be_visible()
        await expect(page.get_by_test_id("member").first).to_be_visible()
        found += await violations(page, "group with members")
        await page.keyboard.press("Escape")
        await page.keyboard.press("Escape")

        await page.get_by_role("button", name="Devices & security").click()
        await expect(page.get_by_test_id("session").first).to_be_visible()
        found += await violations(page, "settings")
        assert not found, "\n".join(found)
    finally:
        for x in (a, b, c):
            await x.aclose()
