"""People by username (issue: "people by number"): a new group and an added member are
named by username (a friend's, or anyone's through the look-up), ids still work as
"#42", and an unknown name is said so with nothing created. Both sizes."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import log_in, uname
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_groups_take_usernames(server: Any, new_page: Any, size: tuple[int, int]) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob", "carol", "dave", "erin")}
    cl = {k: await Client.register(url, n, PASSWORD) for k, n in names.items()}
    await befriend(cl["alice"], cl["bob"])
    page = await new_page(
        "alice", width=size[0], height=size[1], http_errors=[(404, "/v1/users/lookup")]
    )
    await log_in(page, names["alice"], url=url)

    await page.get_by_test_id("new-group-btn").click()
    await page.get_by_test_id("group-name").fill("by name")
    await page.get_by_test_id("group-members").fill(f"{names['bob']}, nosuch{names['carol']}")
    await page.get_by_test_id("group-submit").click()
    await expect(page.get_by_test_id("group-dialog")).to_contain_text(
        f"No user is called nosuch{names['carol']}."
    )
    assert [c for c in await cl["alice"].conversations() if c["type"] == "group"] == []

    await page.get_by_test_id("group-members").fill(
        f"{names['bob']}, {names['carol'].upper()}"  # a username as the server compares it
    )
    await page.get_by_test_id("group-submit").click()
    await expect(page.get_by_test_id("chat-title")).to_have_text("by name")
    await page.get_by_test_id("group-info-btn").click()
    await expect(page.get_by_test_id("member")).to_have_count(3)
    await page.get_by_test_id("add-member-ids").fill(f"{names['dave']} #{cl['erin'].user_id}")
    await page.get_by_test_id("add-member-submit").click()
    await expect(page.get_by_test_id("member")).to_have_count(5)
    for who in ("bob", "carol", "dave", "erin"):
        await expect(page.get_by_test_id("member-list")).to_contain_text(names[who])
    for c in cl.values():
        await c.aclose()
