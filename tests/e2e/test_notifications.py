"""Desktop notifications (issue: "nothing tells you a message came"): permission asked
only from the button, never on load; one notification per message of a chat not on
screen, with the sender and a preview; none for a muted chat unless it mentions me; a
click opens that chat. The browser's Notification is replaced by a recorder."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import log_in, uname
from tests.support import PASSWORD, befriend, eventually

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

RECORDER = """
window.__notes = []; window.__asked = 0;
class RecordedNotification {
  constructor(title, opts) { this.title = title; this.opts = opts || {};
    window.__notes.push(this); }
  close() { this.closed = true; }
  static async requestPermission() { window.__asked += 1;
    RecordedNotification.permission = 'granted'; return 'granted'; }
}
RecordedNotification.permission = 'default';
window.Notification = RecordedNotification;
"""


async def notes(page: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = await page.evaluate(
        "window.__notes.map(n => ({title: n.title, body: n.opts.body, tag: n.opts.tag}))"
    )
    return out


@pytest.mark.parametrize("size", [(1280, 800), (375, 812)], ids=["desktop", "phone"])
async def test_notifications(server: Any, new_page: Any, size: tuple[int, int]) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob", "carol")}
    cl = {k: await Client.register(url, n, PASSWORD) for k, n in names.items()}
    with_bob = await befriend(cl["alice"], cl["bob"])
    with_carol = await befriend(cl["alice"], cl["carol"])
    g = await cl["bob"].create_group("quiet", [cl["alice"].user_id])
    await cl["alice"].conversation_settings(g["conv_id"], muted=True)
    page = await new_page("alice", width=size[0], height=size[1])
    await page.add_init_script(RECORDER)
    await log_in(page, names["alice"], url=url)
    assert await page.evaluate("window.__asked") == 0  # never on load
    button = page.get_by_test_id("notify-btn")
    await button.click()
    await expect(button).to_be_hidden()
    assert await page.evaluate("window.__asked") == 1
    await page.goto(f"{url}/#/c/{with_carol}")  # carol's chat is on screen
    await expect(page.get_by_test_id("chat-title")).to_have_text(names["carol"])
    await cl["bob"].send_rest(with_bob, "are you there?")
    await cl["bob"].send_rest(g["conv_id"], "muted chatter")
    mention = await cl["bob"].send_rest(
        g["conv_id"], f"@{names['alice']} look", mentions=[cl["alice"].user_id]
    )

    async def two() -> list[dict[str, Any]] | None:
        got = await notes(page)
        return got if len(got) >= 2 else None

    got = await eventually(two, timeout=10)
    assert len(got) == 2, got
    assert got[0]["title"] == names["bob"] and got[0]["body"] == "are you there?"
    assert got[1]["title"] == f"{names['bob']} in quiet"
    assert got[1]["tag"] == f"{g['conv_id']}:{mention['seq']}"
    # a message in the chat on screen, in a focused window: no notification
    if await page.evaluate("document.hasFocus()"):
        await cl["carol"].send_rest(with_carol, "on screen")
        await expect(page.get_by_test_id("message-text").get_by_text("on screen")).to_be_visible()
        assert len(await notes(page)) == 2
    # a click opens the chat
    await page.evaluate("window.__notes[0].onclick()")
    await expect(page.get_by_test_id("chat-title")).to_have_text(names["bob"])
    for c in cl.values():
        await c.aclose()
