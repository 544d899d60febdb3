"""The contact list, the chat list and presence follow the server's frames live (no
reload, no poll): a request of mine accepted elsewhere shows the new friend, online, and
the chat within 2 s; a request to me shows at once, and can be declined or blocked; my
own requests show with Cancel. Both sizes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

LIVE_MS = 2_000  # the bound for a change to be on screen


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_contacts_and_presence_follow_the_server_live(
    server: Any, new_page: Any, shots: Path, size: tuple[int, int]
) -> None:
    url = server.url
    alice = uname("alice")
    me = await Client.register(url, alice, PASSWORD)  # alice's other device
    bob = await Client.register(url, uname("bob"), PASSWORD)
    carol = await Client.register(url, uname("carol"), PASSWORD)
    dave = await Client.register(url, uname("dave"), PASSWORD)
    ids = {c.username: c.user_id for c in (bob, carol, dave)}
    bob_ws = await bob.connect()  # online for a long time before he becomes a friend
    page = await new_page("alice", width=size[0], height=size[1])
    await log_in(page, alice, url=url)
    try:
        # my request, sent from my other device, shows here with Cancel
        rid = await me.request_friend(ids[bob.username])  # type: ignore[arg-type]
        out = page.locator(f'[data-testid="outgoing-request"][data-to="{bob.user_id}"]')
        await expect(out).to_be_visible(timeout=LIVE_MS)
        await expect(out.get_by_test_id("cancel-request")).to_be_visible()

        # accepted elsewhere: the friend, online, and the chat, with no reload
        t0 = time.monotonic()
        await bob.accept_friend(rid)
        friend = page.locator(f'[data-testid="friend"][data-user-id="{bob.user_id}"]')
        await expect(friend.get_by_test_id("presence-dot")).to_have_attribute(
            "data-online", "true", timeout=LIVE_MS
        )
        await expect(conv_item(page, bob.username or "")).to_be_visible(timeout=LIVE_MS)
        await expect(out).to_have_count(0)
        took = time.monotonic() - t0
        assert took < LIVE_MS / 1000 + 0.5, f"the new friend took {took:.2f} s to show"
        await expect(
            conv_item(page, bob.username or "").get_by_test_id("presence-dot")
        ).to_have_attribute("data-online", "true")

        # a request to me shows at once; Decline takes it away on both sides
        await carol.request_friend(me.user_id, "hi from carol")  # type: ignore[arg-type]
        inc = page.locator(f'[data-testid="incoming-request"][data-from="{carol.user_id}"]')
        await expect(inc).to_be_visible(timeout=LIVE_MS)
        await shot(page, shots, f"60-requests-{size[0]}")
        await inc.get_by_test_id("decline-request").click()
        await expect(inc).to_have_count(0)
        assert (await carol.friend_requests())["outgoing"] == []
        assert [f["user_id"] for f in await me.friends()] == [bob.user_id]

        # Block (confirmed) blocks the sender and takes the request away
        await dave.request_friend(me.user_id, "let me in")  # type: ignore[arg-type]
        inc = page.locator(f'[data-testid="incoming-request"][data-from="{dave.user_id}"]')
        await expect(inc).to_be_visible(timeout=LIVE_MS)
        page.once("dialog", lambda d: d.accept())
        await inc.get_by_test_id("block-requester").click()
        await expect(inc).to_have_count(0)
        assert await me.blocks() == [dave.user_id]

        # Cancel my own request
        await me.request_friend(ids[carol.username])  # type: ignore[arg-type]
        out = page.locator(f'[data-testid="outgoing-request"][data-to="{carol.user_id}"]')
        await expect(out).to_be_visible(timeout=LIVE_MS)
        await out.get_by_test_id("cancel-request").click()
        await expect(out).to_have_count(0)
        assert (await carol.friend_requests())["incoming"] == []
    finally:
        await bob_ws.close()
        for c in (me, bob, carol, dave):
            await c.aclose()
