"""Group moderation in the web client, in a real browser against a real ``im-server
serve``: the owner mutes a member from the member list (the member list and both
devices' chats show it, the member's send fails with the server's reason), lifts it,
and recalls the member's message from the message menu. The group and its members are
made over REST with ``im_server.client.Client``.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, message, send, shot, uname
from tests.support import PASSWORD

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)


async def test_the_owner_mutes_and_recalls(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    names = {k: uname(k) for k in ("ann", "bo")}
    ann_c = await Client.register(url, names["ann"], PASSWORD)
    bo_c = await Client.register(url, names["bo"], PASSWORD)
    try:
        bo_id = bo_c.user_id
        assert bo_id is not None
        await ann_c.create_group("Book club", [bo_id])

        ann = await new_page("ann")
        bo = await new_page("bo")
        await log_in(ann, names["ann"], url=url)
        await log_in(bo, names["bo"], url=url)
        for page in (ann, bo):
            await conv_item(page, "Book club").click()
            await expect(page.get_by_test_id("chat-title")).to_have_text("Book club")
        said = await send(bo, "spoiler: the butler did it")

        # -- ann mutes bo from the member list ----------------------------------------
        await ann.get_by_test_id("group-info-btn").click()
        bo_row = ann.locator(f'[data-testid="member"][data-user-id="{bo_id}"]')
        await bo_row.get_by_test_id("mute-btn").click()
        await expect(bo_row.get_by_test_id("member-muted")).to_contain_text("muted until")
        await expect(bo_row.get_by_test_id("unmute-btn")).to_be_visible()
        await shot(ann, shots, "70-owner-muted-a-member")
        for page, who in ((ann, "You"), (bo, names["ann"])):
            await expect(page.get_by_test_id("system-message").last).to_contain_text(f"{who} muted")
        # bo's next message is refused with the server's reason
        box = bo.get_by_test_id("composer")
        await box.fill("but wait")
        await box.press("Enter")
        refused = bo.locator('[data-testid="message"][data-mine="true"]').filter(
            has=bo.get_by_test_id("message-text").get_by_text("but wait", exact=True)
        )
        await expect(refused).to_have_attribute("data-status", "failed")
        await shot(bo, shots, "71-muted-member-send-refused")

        # -- ann lifts it, then recalls bo's spoiler from its menu ----------------------
        await bo_row.get_by_test_id("unmute-btn").click()
        await expect(bo_row.get_by_test_id("member-muted")).to_have_count(0)
        await expect(bo.get_by_test_id("system-message").last).to_contain_text("unmuted")
        await send(bo, "sorry")
        await ann.get_by_test_id("group-info-btn").click()  # close the panel
        spoiler = ann.locator(f'[data-testid="message"][data-seq="{said}"]')
        await spoiler.hover()
        await spoiler.get_by_test_id("recall-btn").click()
        for page in (ann, bo):
            gone = page.locator(f'[data-testid="message"][data-seq="{said}"]')
            await expect(gone.get_by_test_id("message-text")).to_have_text("message recalled")
        await expect(message(ann, "sorry")).to_have_count(1)
        await shot(ann, shots, "72-owner-recalled-a-member-message")
    finally:
        await ann_c.aclose()
        await bo_c.aclose()
