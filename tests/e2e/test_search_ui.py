"""Message search in the web client, in a real browser against a real ``im-server
serve``: alice (on ``im_server.client.Client``) sends bob a message with a rare word and
one in Chinese, then a long run of others so both are far back in the history; bob finds
them from the sidebar's search box (a prefix of the word, two Chinese characters), pages
the results with "More results", sees the "no results" state, and a click on a result
opens the chat at that message (older history loaded down to it), scrolled into view and
highlighted.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend, eventually

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

RARE = "the zephyrquartz plan is on for Friday"
CHINESE = "你好世界，明天见"
FILLERS = 90


def results(page: Any) -> Any:
    return page.get_by_test_id("search-result")


async def search(page: Any, q: str) -> None:
    box = page.get_by_test_id("search-input")
    await box.fill(q)
    await box.press("Enter")


async def test_search_and_jump_to_a_message(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob")}
    alice_c = await Client.register(url, names["alice"], PASSWORD)
    bob_c = await Client.register(url, names["bob"], PASSWORD)
    try:
        conv = await befriend(alice_c, bob_c)
        rare_seq = (await alice_c.send_rest(conv, {"text": RARE}))["seq"]
        chinese_seq = (await alice_c.send_rest(conv, {"text": CHINESE}))["seq"]
        for i in range(FILLERS):
            await alice_c.send_rest(conv, {"text": f"filler message number {i}"})

        # the persister has written them all: the last one is found
        async def all_found() -> bool:
            return len(await bob_c.search_all("filler")) == FILLERS

        await eventually(all_found, timeout=20, interval=0.2)

        bob = await new_page("bob")
        await log_in(bob, names["bob"], url=url)
        await expect(conv_item(bob, names["alice"])).to_have_count(1)
        held = f"(seq) => window.__im.store.conv({conv!r}, false)?.msgs.has(seq) ?? false"
        assert not await bob.evaluate(held, rare_seq)  # far back: not loaded yet

        # -- a prefix of the rare word finds its message ----------------------------------
        await search(bob, "zephyr")
        hit = results(bob)
        await expect(hit).to_have_count(1)
        await expect(hit.get_by_test_id("search-result-conv")).to_have_text(names["alice"])
        await expect(hit.get_by_test_id("search-result-sender")).to_have_text(names["alice"])
        await expect(hit.get_by_test_id("search-result-text")).to_contain_text(RARE)
        await expect(hit.locator("mark.hit")).to_have_text("zephyr")
        await expect(hit).to_have_attribute("data-seq", str(rare_seq))
        # the chat list gives way to the results
        await expect(bob.get_by_test_id("conv-list")).to_be_hidden()
        await shot(bob, shots, "90-search-results")

        # -- a click opens the chat at that message, loaded from far back ----------------
        await hit.click()
        await expect(bob.get_by_test_id("chat-title")).to_have_text(names["alice"])
        row = bob.locator(f'[data-testid="message"][data-seq="{rare_seq}"]')
        await expect(row.get_by_test_id("message-text")).to_have_text(RARE)
        await expect(row).to_have_class(re.compile(r"\bfound\b"))
        await expect(row).to_be_in_viewport()
        await shot(bob, shots, "91-search-jumped-to-message")
        await expect(row).not_to_have_class(re.compile(r"\bfound\b"), timeout=8_000)

        # -- two Chinese characters find the Chinese message -----------------------------
        await search(bob, "世界")
        await expect(hit).to_have_count(1)
        await expect(hit).to_have_attribute("data-seq", str(chinese_seq))
        await expect(hit.get_by_test_id("search-result-text")).to_contain_text(CHINESE)
        await expect(hit.locator("mark.hit")).to_have_text("世界")
        await shot(bob, shots, "92-search-chinese")

        # -- many results: a page, then "More results" ------------------------------------
        await search(bob, "filler")
        await expect(hit).to_have_count(20)
        await expect(hit.first.get_by_test_id("search-result-text")).to_contain_text(
            f"filler message number {FILLERS - 1}"  # newest first
        )
        await bob.get_by_test_id("search-more").click()
        await expect(hit).to_have_count(40)
        # another result, in the chat already open: it is scrolled to and highlighted
        await hit.nth(39).click()
        seq39 = await hit.nth(39).get_attribute("data-seq")
        await expect(bob.locator(f'[data-testid="message"][data-seq="{seq39}"]')).to_have_class(
            re.compile(r"\bfound\b")
        )

        # -- nothing found: the "no results" state ----------------------------------------
        await search(bob, "xylophonequagmire")
        await expect(bob.get_by_test_id("search-status")).to_contain_text("No messages found")
        await expect(hit).to_have_count(0)
        await expect(bob.get_by_test_id("search-more")).to_be_hidden()
        await shot(bob, shots, "93-search-no-results")

        # -- × closes the search: the chat list is back ----------------------------------
        await bob.get_by_test_id("search-clear").click()
        await expect(bob.get_by_test_id("search-results")).to_be_hidden()
        await expect(bob.get_by_test_id("search-input")).to_have_value("")
        await expect(conv_item(bob, names["alice"])).to_be_visible()

        # typing searches after a pause too (no Enter); Escape closes it
        await bob.get_by_test_id("search-input").press_sequentially("zephyrq", delay=20)
        await expect(hit).to_have_count(1)
        await bob.get_by_test_id("search-input").press("Escape")
        await expect(bob.get_by_test_id("search-results")).to_be_hidden()
        await expect(bob.get_by_test_id("chat-title")).to_have_text(names["alice"])  # still open
    finally:
        await alice_c.aclose()
        await bob_c.aclose()
