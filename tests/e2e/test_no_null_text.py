"""No ``null``, ``undefined`` or ``NaN`` anywhere a person reads (issue: "a literal null
in the members panel"): the login screen, the chat list, a single chat, a group with its
members panel (a muted member, an admin, a member with no display name of its own), the
sessions screen. Both sizes."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

BAD = re.compile(r"\b(null|undefined|NaN)\b")


async def no_bad_words(page: Any, where: str) -> None:
    text = await page.evaluate("document.body.innerText")
    titles = await page.evaluate(
        "[...document.querySelectorAll('[title],[aria-label],[placeholder]')]"
        ".map(e => [e.title, e.getAttribute('aria-label'), e.placeholder].join(' ')).join(' ')"
    )
    for got in (text, titles):
        hit = BAD.search(got)
        assert hit is None, (
            f"{where}: {hit.group(0)!r} in …{got[max(0, hit.start() - 60) : hit.end() + 60]}…"
        )


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_nothing_reads_null(server: Any, new_page: Any, size: tuple[int, int]) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob", "carol")}
    cl = {k: await Client.register(url, n, PASSWORD) for k, n in names.items()}
    await befriend(cl["alice"], cl["bob"])
    g = await cl["alice"].create_group("nulls", [cl["bob"].user_id, cl["carol"].user_id])
    await cl["alice"].set_role(g["group_id"], cl["bob"].user_id, "admin")
    await cl["alice"].mute_member(
        g["group_id"], cl["carol"].user_id, int(time.time() * 1000) + 3_600_000
    )
    await cl["bob"].send_rest(g["conv_id"], "hello")
    page = await new_page("alice", width=size[0], height=size[1])
    await page.goto(url + "/")
    await expect(page.get_by_test_id("auth-screen")).to_be_visible()
    await no_bad_words(page, "login")
    await log_in(page, names["alice"])
    await no_bad_words(page, "chat list")
    await conv_item(page, names["bob"]).click()
    await expect(page.get_by_test_id("chat-title")).to_have_text(names["bob"])
    await no_bad_words(page, "single chat")
    await page.goto(f"{url}/#/c/{g['conv_id']}")
    await expect(page.get_by_test_id("chat-title")).to_have_text("nulls")
    await page.get_by_test_id("group-info-btn").click()
    await expect(page.get_by_test_id("member")).to_have_count(3)
    await expect(page.get_by_test_id("member-muted")).to_have_count(1)
    await no_bad_words(page, "group and members")
    await page.keyboard.press("Escape")  # the members panel
    await page.keyboard.press("Escape")  # the chat (on a phone the list is a screen of its own)
    await page.get_by_test_id("sessions-btn").click()
    await expect(page.get_by_test_id("sessions-dialog")).to_be_visible()
    await expect(page.get_by_test_id("session").first).to_be_visible()
    await no_bad_words(page, "sessions")
    for c in cl.values():
        await c.aclose()
