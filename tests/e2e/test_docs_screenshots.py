"""The screenshots of docs/screenshots/ (and the README's), taken from a real session at
both sizes: a group chat with replies, a reaction, a link and a mention, the chat list
with a friend request, the members panel. Each scene is checked before it is taken;
``IM_DOCS_SCREENSHOTS=1`` also copies them into docs/screenshots/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, message, shot
from tests.support import PASSWORD, befriend

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def copy_to_docs(shots: Path, tag: str) -> None:
    DOCS.mkdir(exist_ok=True)
    for p in shots.glob(f"docs-*-{tag}.png"):
        shutil.copy(p, DOCS / p.name)


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_docs_screenshots(
    server: Any, new_page: Any, shots: Path, size: tuple[int, int]
) -> None:
    url = server.url
    tag = f"{size[0]}"
    names = {k: f"{k}_{os.urandom(2).hex()}" for k in ("ann", "ben", "cleo", "dev")}
    cl = {k: await Client.register(url, n, PASSWORD) for k, n in names.items()}
    try:
        for k in ("ben", "cleo"):
            await befriend(cl["ann"], cl[k])
        await cl["dev"].request_friend(cl["ann"].user_id, "Hi Ann, it's Dev from the climbing gym")  # type: ignore[arg-type]
        g = await cl["ann"].create_group("Weekend trip", [cl["ben"].user_id, cl["cleo"].user_id])
        conv = g["conv_id"]
        s1 = (await cl["ben"].send_rest(conv, "Who's in for Saturday? The forecast looks great"))[
            "seq"
        ]
        await cl["cleo"].send_rest(
            conv, "Me! Here's the route: https://example.com/trails/ridge-loop"
        )
        await cl["ann"].send_rest(conv, "Count me in", reply_to=s1)
        await cl["ben"].react(conv, s1, "🎉")
        await cl["cleo"].send_rest(
            conv,
            {"text": f"@{names['ann']} can you bring the stove?", "mentions": [cl["ann"].user_id]},
        )
        page = await new_page("ann", width=size[0], height=size[1])
        await log_in(page, names["ann"], url=url)
        await expect(page.get_by_test_id("incoming-request")).to_be_visible()
        await expect(conv_item(page, "Weekend trip")).to_be_visible()
        await shot(page, shots, f"docs-list-{tag}")
        await conv_item(page, "Weekend trip").click()
        await expect(message(page, "Count me in")).to_be_visible()
        await expect(message(page, "Count me in").get_by_test_id("reply-quote")).to_be_visible()
        await expect(page.get_by_test_id("reaction-chip")).to_have_count(1)
        await expect(
            page.locator('a[href="https://example.com/trails/ridge-loop"]')
        ).to_be_visible()
        await shot(page, shots, f"docs-chat-{tag}")
        if size[0] >= 1000:
            await page.get_by_test_id("group-info-btn").click()
            await expect(page.get_by_test_id("member")).to_have_count(3)
            await shot(page, shots, f"docs-members-{tag}")
        if os.environ.get("IM_DOCS_SCREENSHOTS") == "1":
            copy_to_docs(shots, tag)
    finally:
        for c in cl.values():
            await c.aclose()
