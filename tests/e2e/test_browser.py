"""The web client in a real browser against a real ``im-server serve``: two people
register, become friends, chat, watch unread badges and message states, use a group
with read counts, and one of them drops offline and catches up by itself.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from playwright.async_api import expect  # in the test extras

from im_server.client.transport import HttpPool
from tests.e2e.pages import conv_item, message, my_message, send, shot, uname
from tests.support import PASSWORD

pytestmark = pytest.mark.timeout(120)
expect.set_options(timeout=10_000)

# Records every change of a message row's data-status (ack, delivered, read), in order.
STATUS_RECORDER = """() => {
  window.__statusLog = [];
  new MutationObserver((muts) => {
    for (const m of muts) {
      const el = m.target;
      if (el.dataset && el.dataset.testid === 'message' && el.dataset.status) {
        window.__statusLog.push([el.querySelector('.text').textContent, el.dataset.status]);
      }
    }
  }).observe(document.getElementById('timeline'), { attributes: true, subtree: true, attributeFilter: ['data-status'] });
}"""


async def register(page: Any, url: str, username: str) -> int:
    await page.goto(url + "/")
    await expect(page.get_by_test_id("auth-screen")).to_be_visible()
    await page.get_by_test_id("auth-username").fill(username)
    await page.get_by_test_id("auth-password").fill(PASSWORD)
    await page.get_by_test_id("register-btn").click()
    my_id = page.get_by_test_id("my-id")
    await expect(my_id).to_have_text(re.compile(r"my id: \d+"))
    await expect(page.get_by_test_id("offline-banner")).to_be_hidden()
    return int(await my_id.get_attribute("data-user-id"))


async def rest_user(http: HttpPool, username: str) -> tuple[int, dict[str, str]]:
    r = await http.post("/v1/users", json={"username": username, "password": PASSWORD})
    r.raise_for_status()
    s = (await http.post("/v1/sessions", json={"username": username, "password": PASSWORD})).json()
    return s["user_id"], {"Authorization": f"Bearer {s['token']}"}


async def test_two_people_chat(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    alice_name, bob_name = uname("alice"), uname("bob")
    alice = await new_page("alice")
    bob = await new_page("bob", http_errors=[(404, "/v1/users/lookup")])  # the name he mistypes

    # -- register in the UI ------------------------------------------------------------
    await alice.goto(url + "/")
    await alice.get_by_test_id("auth-username").fill(alice_name)
    await alice.get_by_test_id("auth-password").fill(PASSWORD)
    await shot(alice, shots, "01-login")
    alice_id = await register(alice, url, alice_name)
    bob_id = await register(bob, url, bob_name)
    await shot(alice, shots, "02-alice-empty")

    # -- bob asks alice by her username (spelled in capitals), alice accepts ------------
    await bob.get_by_test_id("add-friend-btn").click()
    await bob.get_by_test_id("friend-id").fill(alice_name + "zz")
    await bob.get_by_test_id("friend-submit").click()
    await expect(bob.locator("#friend-error")).to_contain_text("No user is called")
    await bob.get_by_test_id("friend-id").fill(alice_name.upper())
    await shot(bob, shots, "03-bob-add-friend")
    await bob.get_by_test_id("friend-submit").click()
    await expect(bob.get_by_test_id("outgoing-request")).to_have_count(1)
    request = alice.get_by_test_id("incoming-request")
    await expect(request).to_have_count(1)
    await expect(request).to_contain_text(bob_name)  # the note names the sender
    await expect(request.get_by_test_id("request-from")).to_have_text(bob_name)  # not a friend yet
    await shot(alice, shots, "04-alice-incoming-request")
    await request.get_by_test_id("accept-request").click()
    await expect(alice.get_by_test_id("chat-title")).to_have_text(bob_name)
    await expect(conv_item(bob, alice_name)).to_have_count(1)

    # -- bob writes first (alice has no chat open), then closes the chat --------------
    await alice.get_by_test_id("chat-close").click()
    await expect(alice.get_by_test_id("chat-title")).to_be_hidden()
    await conv_item(bob, alice_name).click()
    await send(bob, "hi alice!")
    await bob.get_by_test_id("chat-close").click()
    await expect(bob.get_by_test_id("chat-title")).to_be_hidden()
    a_badge = conv_item(alice, bob_name).get_by_test_id("unread-badge")
    await expect(a_badge).to_have_text("1")
    await shot(alice, shots, "05-alice-unread-badge")
    await conv_item(alice, bob_name).click()
    await expect(message(alice, "hi alice!")).to_have_count(1)
    await expect(a_badge).to_be_hidden()

    # -- alice answers: sent -> delivered (bob online, chat closed) --------------------
    await alice.evaluate(STATUS_RECORDER)
    await send(alice, "hello bob")
    first = my_message(alice, "hello bob")
    await expect(first).to_have_attribute("data-status", "delivered")
    b_badge = conv_item(bob, alice_name).get_by_test_id("unread-badge")
    await expect(b_badge).to_have_text("1")
    await send(alice, "are you there?")
    await expect(b_badge).to_have_text("2")
    await expect(conv_item(bob, alice_name).get_by_test_id("conv-preview")).to_have_text(
        "are you there?"
    )
    await shot(alice, shots, "06-alice-delivered")
    await shot(bob, shots, "07-bob-unread-2")

    # -- bob opens the chat: his badge clears, alice sees "read" -----------------------
    await conv_item(bob, alice_name).click()
    await expect(b_badge).to_be_hidden()
    await expect(message(bob, "are you there?")).to_have_count(1)
    await expect(first).to_have_attribute("data-status", "read")
    await expect(my_message(alice, "are you there?")).to_have_attribute("data-status", "read")
    await expect(alice.get_by_test_id("msg-status")).to_have_text("Read")
    log = await alice.evaluate("window.__statusLog")
    states = [s for text, s in log if text == "hello bob"]
    seen = [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]
    assert seen == ["sent", "delivered", "read"], log
    await shot(alice, shots, "08-alice-read")

    # -- typing indicator, then recall -------------------------------------------------
    await bob.get_by_test_id("composer").press_sequentially("typing...", delay=20)
    await expect(alice.get_by_test_id("typing")).to_have_text(f"{bob_name} is typing…")
    await shot(alice, shots, "09-alice-sees-typing")
    await bob.get_by_test_id("composer").fill("")
    await send(alice, "oops, wrong chat")
    await expect(message(bob, "oops, wrong chat")).to_have_count(1)
    # let the row settle (its state line changes under it) before aiming at its button
    await expect(my_message(alice, "oops, wrong chat")).to_have_attribute("data-status", "read")
    recalled_seq = await my_message(alice, "oops, wrong chat").get_attribute("data-seq")
    oops = alice.locator(f'[data-testid="message"][data-seq="{recalled_seq}"]')
    await oops.hover()
    await oops.get_by_test_id("recall-btn").click()
    await expect(oops).to_have_class(re.compile(r"\brecalled\b"))
    await expect(oops.get_by_test_id("message-text")).to_have_text("message recalled")
    bob_recalled = bob.locator(f'[data-testid="message"][data-seq="{recalled_seq}"]')
    await expect(bob_recalled.get_by_test_id("message-text")).to_have_text("message recalled")
    await shot(bob, shots, "10-bob-recalled")

    # -- a group of three: "N read" under alice's message ------------------------------
    async with HttpPool(base_url=url, timeout=10) as http:
        carol_name = uname("carol")
        carol_id, carol_auth = await rest_user(http, carol_name)
        dave_name = uname("dave")
        dave_id, _ = await rest_user(http, dave_name)

        await alice.get_by_test_id("new-group-btn").click()
        await alice.get_by_test_id("group-name").fill("Weekend trip")
        # people by username (a friend's, and carol's, who is no friend: looked up)
        await alice.get_by_test_id("group-members").fill(f"{bob_name}, {carol_name}")
        await shot(alice, shots, "11-alice-new-group")
        await alice.get_by_test_id("group-submit").click()
        await expect(alice.get_by_test_id("chat-title")).to_have_text("Weekend trip")
        await send(alice, "who's in for saturday?")
        group_item = conv_item(bob, "Weekend trip")
        await expect(group_item.get_by_test_id("unread-badge")).to_have_text("1")
        await group_item.click()
        await expect(message(bob, "who's in for saturday?")).to_have_count(1)
        mine = my_message(alice, "who's in for saturday?")
        await expect(mine.get_by_test_id("read-count")).to_have_text("1 read")
        conv_id = await alice.evaluate("window.__im.store.openId")
        seq = int(await mine.get_attribute("data-seq"))
        r = await http.post(
            f"/v1/conversations/{conv_id}/read", json={"seq": seq}, headers=carol_auth
        )
        assert r.status_code == 200, r.text
        await expect(mine.get_by_test_id("read-count")).to_have_text("2 read")
        await mine.get_by_test_id("read-count").click()
        await expect(alice.get_by_test_id("receipts-summary")).to_have_text("2 of 2 read")
        readers = alice.get_by_test_id("reader")
        await expect(readers).to_have_count(2)
        # carol is no friend of alice's: her name comes from the members or GET /v1/users/{id}
        await expect(readers).to_contain_text(
            [bob_name, carol_name] if bob_id < carol_id else [carol_name, bob_name]
        )
        await expect(alice.get_by_test_id("receipts-body")).not_to_contain_text("user #")
        await shot(alice, shots, "12-group-readers")
        await alice.keyboard.press("Escape")

        # members panel: roles; add dave with history -> a system notice
        await alice.get_by_test_id("group-info-btn").click()
        await expect(alice.get_by_test_id("member")).to_have_count(3)
        await expect(
            alice.locator(
                f'[data-testid="member"][data-user-id="{alice_id}"] [data-testid="member-role"]'
            )
        ).to_have_text("owner")
        await alice.get_by_test_id("add-member-ids").fill(f"#{dave_id}")  # ids still work
        await alice.get_by_test_id("add-member-history").check()
        await alice.get_by_test_id("add-member-submit").click()
        await expect(alice.get_by_test_id("member")).to_have_count(4)
        # dave is nobody's friend: his username is looked up, not "user #N"
        await expect(alice.get_by_test_id("system-message")).to_have_text(
            f"You added {dave_name} (with history)"
        )
        await expect(bob.get_by_test_id("system-message")).to_have_text(
            f"{alice_name} added {dave_name} (with history)"
        )
        await expect(
            alice.locator(f'[data-testid="member"][data-user-id="{dave_id}"]')
        ).to_contain_text(dave_name)
        await shot(alice, shots, "13-group-members")
        await alice.get_by_test_id("group-info-btn").click()

    # -- bob goes offline; alice sends 3 messages; bob comes back and catches up -------
    await conv_item(bob, alice_name).click()
    await conv_item(alice, bob_name).click()
    await bob.context.set_offline(True)
    await expect(bob.get_by_test_id("offline-banner")).to_be_visible()
    await expect(bob.get_by_test_id("offline-banner")).to_contain_text("offline")
    for i in (1, 2, 3):
        await send(alice, f"while you were away {i}")
    await expect(my_message(alice, "while you were away 3")).to_have_attribute(
        "data-status", "sent"
    )
    # and more than a sync answer carries (recent=20) from alice's other device, so
    # that bob's client has to pull a seq range with history as well
    conv_id = f"s:{min(alice_id, bob_id)}:{max(alice_id, bob_id)}"
    async with HttpPool(base_url=url, timeout=10) as http:
        s = (
            await http.post("/v1/sessions", json={"username": alice_name, "password": PASSWORD})
        ).json()
        alice_auth = {"Authorization": f"Bearer {s['token']}"}
        for i in range(1, 23):
            r = await http.post(
                f"/v1/conversations/{conv_id}/messages",
                headers=alice_auth,
                json={"client_msg_id": f"phone-{i}", "content": {"text": f"from my phone {i}"}},
            )
            assert r.status_code == 200, r.text
    await expect(message(alice, "from my phone 22")).to_have_count(1)  # her other device
    await shot(bob, shots, "14-bob-offline")
    assert await message(bob, "while you were away 1").count() == 0

    pulls: list[str] = []
    bob.on("request", lambda r: pulls.append(r.url) if "/messages?" in r.url else None)
    await bob.context.set_offline(False)
    await expect(bob.get_by_test_id("offline-banner")).to_be_hidden()
    for i in (1, 2, 3):
        await expect(message(bob, f"while you were away {i}")).to_have_count(1)
    for i in (1, 11, 22):
        await expect(message(bob, f"from my phone {i}")).to_have_count(1)
    await expect(my_message(alice, "while you were away 3")).to_have_attribute(
        "data-status", "read"
    )
    async with HttpPool(base_url=url, timeout=10) as http:
        s = (
            await http.post("/v1/sessions", json={"username": bob_name, "password": PASSWORD})
        ).json()
        hist = (
            await http.get(
                f"/v1/conversations/{conv_id}/messages",
                params={"limit": 200},
                headers={"Authorization": f"Bearer {s['token']}"},
            )
        ).json()
    expected = [m["seq"] for m in hist["messages"] if m["content_type"] != "recall"]
    rows = bob.get_by_test_id("message")
    await expect(rows).to_have_count(len(expected))
    seqs = await rows.evaluate_all("els => els.map(e => Number(e.dataset.seq))")
    assert seqs == expected, f"bob's client holds {seqs}, the server {expected}"
    assert any("begin=" in u and "order=asc" in u for u in pulls), pulls  # a range pull
    await shot(bob, shots, "15-bob-caught-up")
    await shot(alice, shots, "16-alice-all-read")


async def test_history_pages_back_to_the_start(server: Any, new_page: Any, shots: Path) -> None:
    """130 messages, a new device: the newest arrive with sync, scrolling up pulls the
    older ones page by page down to seq 1, each exactly once."""
    url = server.url
    async with HttpPool(base_url=url, timeout=10) as http:
        carol_name, dan_name = uname("carol"), uname("dan")
        carol_id, carol_auth = await rest_user(http, carol_name)
        dan_id, dan_auth = await rest_user(http, dan_name)
        rid = (
            await http.post("/v1/friends/requests", json={"to_user_id": carol_id}, headers=dan_auth)
        ).json()
        conv = (
            await http.post(f"/v1/friends/requests/{rid['request_id']}/accept", headers=carol_auth)
        ).json()["conv_id"]
        total = 130
        for i in range(1, total + 1):
            who = dan_auth if i % 3 else carol_auth
            r = await http.post(
                f"/v1/conversations/{conv}/messages",
                headers=who,
                json={"client_msg_id": f"m{i}", "content": {"text": f"message {i}"}},
            )
            assert r.status_code == 200, r.text

        page = await new_page("carol", width=900, height=700)
        await page.goto(url + "/")
        await page.get_by_test_id("auth-username").fill(carol_name)
        await page.get_by_test_id("auth-password").fill(PASSWORD)
        await page.get_by_test_id("login-btn").click()
        item = conv_item(page, dan_name)
        await expect(item.get_by_test_id("conv-preview")).to_have_text(
            f"message {total}"
        )  # from dan (130 % 3 != 0)
        await item.click()
        await expect(message(page, f"message {total}")).to_have_count(1)
        rows = page.get_by_test_id("message")
        for _ in range(30):
            if await page.get_by_test_id("older").get_attribute("data-state") == "end":
                break
            shown = await rows.count()
            await page.get_by_test_id("messages").evaluate("el => { el.scrollTop = 0; }")
            # scrolled to the top: wait for the older page (more rows) or the start; a
            # scroll the client ignored (a page was loading, or no scroll event because
            # it was at the top already) is made again
            with contextlib.suppress(PlaywrightTimeoutError):
                await page.wait_for_function(
                    """n => document.querySelectorAll('[data-testid="message"]').length > n
                        || document.getElementById('older').dataset.state === 'end'""",
                    arg=shown,
                    timeout=1000,
                )
        await expect(page.get_by_test_id("older")).to_have_attribute("data-state", "end")
        await expect(rows).to_have_count(total)
        await expect(message(page, "message 1")).to_be_visible()
        seqs = await rows.evaluate_all("els => els.map(e => Number(e.dataset.seq))")
        assert seqs == list(range(1, total + 1))
        await shot(page, shots, "17-history-start")

        # the same client on a phone-sized screen: one pane at a time
        await page.set_viewport_size({"width": 390, "height": 760})
        await page.get_by_test_id("messages").evaluate("el => { el.scrollTop = el.scrollHeight; }")
        await shot(page, shots, "18-mobile-chat")
        await page.get_by_test_id("chat-close").click()
        await expect(item).to_be_visible()
        await shot(page, shots, "19-mobile-list")

        # the session survives a reload (token in localStorage); logging out ends it
        await page.reload()
        await expect(item).to_be_visible()
        async with page.expect_navigation():  # logging out reloads the page: a clean slate
            await page.get_by_test_id("logout-btn").click()
        await expect(page.get_by_test_id("auth-screen")).to_be_visible()
        assert await page.evaluate("localStorage.getItem('im.session')") is None
