"""Mentions, replies, edits, reactions and presence in the web client, in a real browser
against a real ``im-server serve``: two people in browsers (alice owns a group, bob is a
member) and a third one, carol, on ``im_server.client.Client``. Each feature is checked on
both sides and against what the server stored.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from tests.e2e.pages import conv_item, log_in, message, send, sent_seq, shot, uname
from tests.support import PASSWORD, befriend, eventually

pytestmark = pytest.mark.timeout(180)
expect.set_options(timeout=10_000)

# Presence offline is announced after IM_PRESENCE_OFFLINE_GRACE_SECONDS (5 s).
PRESENCE_TIMEOUT_MS = 25_000


def row(page: Any, seq: int) -> Any:
    return page.locator(f'[data-testid="message"][data-seq="{seq}"]')


async def stored(client: Client, conv: str, seq: int) -> dict[str, Any]:
    """The message as the server stored it (waits until it is persisted)."""

    async def get() -> dict[str, Any] | None:
        msgs = (await client.history(conv, begin=seq, end=seq))["messages"]
        return msgs[0] if msgs else None

    found: dict[str, Any] = await eventually(get)
    return found


async def action(page: Any, seq: int, testid: str) -> None:
    """Click one of a message's hover actions (reply, react, edit)."""
    r = row(page, seq)
    await r.hover()
    await r.get_by_test_id(testid).click()


def chip(page: Any, seq: int, emoji: str) -> Any:
    return row(page, seq).locator(f'[data-testid="reaction-chip"][data-emoji="{emoji}"]')


async def test_mentions_replies_edits_reactions(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    names = {k: uname(k) for k in ("alice", "bob", "carol")}
    alice_c = await Client.register(url, names["alice"], PASSWORD)
    bob_c = await Client.register(url, names["bob"], PASSWORD)  # bob's phone
    carol = await Client.register(url, names["carol"], PASSWORD)
    try:
        bob_id, carol_id = bob_c.user_id, carol.user_id
        assert bob_id is not None and carol_id is not None
        g = await alice_c.create_group("Launch crew", [bob_id, carol_id])
        conv = g["conv_id"]
        alice = await new_page("alice")
        # the reaction limit below is a 409 on purpose (Chromium logs it as an error)
        bob = await new_page("bob", http_errors=[(409, "/v1/conversations/")])
        await log_in(alice, names["alice"], url=url)
        await log_in(bob, names["bob"], url=url)
        # the member list is held back: "@" typed before it comes is answered when it does
        members_answer = asyncio.Event()

        async def hold(route: Any) -> None:
            await members_answer.wait()
            await route.continue_()

        await alice.route("**/v1/groups/*/members", hold)
        await conv_item(alice, "Launch crew").click()
        await expect(alice.get_by_test_id("chat-title")).to_have_text("Launch crew")

        # -- mentions: "@" opens the members; choosing one inserts @name ------------------
        box = alice.get_by_test_id("composer")
        await box.press_sequentially("ready @" + names["bob"][:4], delay=10)
        options = alice.get_by_test_id("mention-option")
        await expect(alice.get_by_test_id("mention-list")).to_be_hidden()
        members_answer.set()
        await expect(options).to_have_count(1)  # bob only: carol does not match
        await alice.unroute("**/v1/groups/*/members")
        await expect(options).to_have_attribute("data-user-id", str(bob_id))
        await box.press("Backspace")
        await box.press("Backspace")
        await box.press("Backspace")
        await box.press("Backspace")  # "@" alone: every member, and @all for the owner
        await expect(options).to_have_count(3)
        await expect(
            alice.locator('[data-testid="mention-option"][data-user-id="all"]')
        ).to_have_count(1)
        await box.press_sequentially(names["bob"][:3], delay=10)
        await shot(alice, shots, "30-mention-autocomplete")
        await options.filter(has_text=names["bob"]).click()
        await expect(box).to_have_value(f"ready @{names['bob']} ")
        await box.press_sequentially("for launch?", delay=5)
        await box.press("Enter")
        mention_seq = await sent_seq(alice, f"ready @{names['bob']} for launch?")
        m = await stored(carol, conv, mention_seq)
        assert m["mentions"] == [bob_id] and m["mention_all"] is False, m
        assert m["content"] == {"text": f"ready @{names['bob']} for launch?"}

        # bob (chat closed): the "@" badge next to the unread count, then highlighted
        item = conv_item(bob, "Launch crew")
        await expect(item.get_by_test_id("unread-badge")).to_have_text("1")
        await expect(item.get_by_test_id("mention-badge")).to_be_visible()
        await shot(bob, shots, "31-mention-badge")
        await bob.reload()  # the same from the server's count (mention_unread in sync)
        await expect(item.get_by_test_id("unread-badge")).to_have_text("1")
        await expect(item.get_by_test_id("mention-badge")).to_be_visible()
        await item.click()
        await expect(row(bob, mention_seq)).to_have_attribute("data-mentioned", "true")
        await expect(row(bob, mention_seq).locator(".mention-token.to-me")).to_have_text(
            f"@{names['bob']}"
        )
        await expect(item.get_by_test_id("mention-badge")).to_be_hidden()
        await expect(item.get_by_test_id("unread-badge")).to_be_hidden()
        await shot(bob, shots, "32-mention-highlight")

        # a member gets no @all; the owner's @all reaches everyone
        bob_box = bob.get_by_test_id("composer")
        await bob_box.press_sequentially("@", delay=10)
        await expect(bob.get_by_test_id("mention-option")).to_have_count(2)
        await expect(
            bob.locator('[data-testid="mention-option"][data-user-id="all"]')
        ).to_have_count(0)
        await bob_box.press("Escape")
        await expect(bob.get_by_test_id("mention-list")).to_be_hidden()
        await bob_box.fill("")
        await box.press_sequentially("@al", delay=10)
        await alice.locator('[data-testid="mention-option"][data-user-id="all"]').click()
        await box.press_sequentially("standup in 5", delay=5)
        await box.press("Enter")
        all_row = message(bob, "@all standup in 5")
        await expect(all_row).to_have_attribute("data-mentioned", "true")
        all_seq = int(await all_row.get_attribute("data-seq") or 0)
        assert (await stored(carol, conv, all_seq))["mention_all"] is True
        # a message mentioning someone else is not highlighted for me
        await expect(message(alice, "@all standup in 5")).not_to_have_attribute(
            "data-mentioned", "true"
        )

        # -- replies: the quote on both sides; the stored reply_to -----------------------
        await action(bob, mention_seq, "reply-btn")
        ctx = bob.get_by_test_id("compose-context")
        await expect(ctx).to_contain_text(f"Replying to {names['alice']}")
        await expect(ctx).to_contain_text("for launch?")
        await bob_box.fill("count me in")
        await shot(bob, shots, "33-replying")
        await bob_box.press("Enter")
        await expect(ctx).to_be_hidden()
        for page, who in ((bob, names["alice"]), (alice, "You")):
            reply = message(page, "count me in")
            await expect(reply.get_by_test_id("quote-sender")).to_have_text(who)
            await expect(reply.get_by_test_id("quote-text")).to_have_text(
                f"ready @{names['bob']} for launch?"
            )
        reply_seq = int(await message(bob, "count me in").get_attribute("data-seq") or 0)
        assert (await stored(carol, conv, reply_seq))["reply_to"] == mention_seq
        # a cancelled reply sends none
        await action(bob, all_seq, "reply-btn")
        await expect(ctx).to_be_visible()
        await bob.get_by_test_id("compose-cancel").click()
        await expect(ctx).to_be_hidden()
        plain_seq = await send(bob, "no reply here")
        assert (await stored(carol, conv, plain_seq))["reply_to"] is None
        await expect(row(bob, plain_seq).get_by_test_id("reply-quote")).to_be_hidden()

        # a reply to a message recalled later: the quote turns "message unavailable"
        oops_seq = await send(alice, "wrong channel, sorry")
        await stored(carol, conv, oops_seq)
        r = await carol.send_rest(conv, {"text": "which channel?"}, reply_to=oops_seq)
        quote = row(bob, int(r["seq"])).get_by_test_id("quote-text")
        await expect(quote).to_have_text("wrong channel, sorry")
        await alice_c.recall(conv, oops_seq)
        await expect(quote).to_have_text("message unavailable")

        # -- edits: my own text message; the mark and the new text on both sides ---------
        await action(alice, mention_seq, "edit-btn")
        await expect(alice.get_by_test_id("compose-context")).to_contain_text("Editing")
        await expect(box).to_have_value(f"ready @{names['bob']} for launch?")
        await box.fill("ready for launch at noon?")
        await box.press("Enter")
        for page in (alice, bob):
            r_ = row(page, mention_seq)
            await expect(r_.get_by_test_id("message-text")).to_have_text(
                "ready for launch at noon?"
            )
            await expect(r_.get_by_test_id("message-edited")).to_be_visible()
        # the quote of the reply follows the edit
        await expect(message(bob, "count me in").get_by_test_id("quote-text")).to_have_text(
            "ready for launch at noon?"
        )
        assert (await stored(carol, conv, mention_seq))["content"] == {
            "text": "ready for launch at noon?"
        }
        # only my own messages have an edit action
        await row(alice, reply_seq).hover()
        await expect(row(alice, reply_seq).get_by_test_id("edit-btn")).to_have_count(0)
        await shot(alice, shots, "34-edited")

        # an edit notice from another member, while bob's chat is closed: updated in
        # place, not shown, not unread
        carol_seq = int((await carol.send_rest(conv, {"text": "lunch at 1"}))["seq"])
        await expect(row(bob, carol_seq)).to_have_count(1)
        await bob.get_by_test_id("chat-close").click()
        rows_before = await alice.get_by_test_id("message").count()
        await carol.edit(conv, carol_seq, "lunch at 2")
        await expect(row(alice, carol_seq).get_by_test_id("message-text")).to_have_text(
            "lunch at 2"
        )
        await expect(row(alice, carol_seq).get_by_test_id("message-edited")).to_be_visible()
        assert await alice.get_by_test_id("message").count() == rows_before
        await expect(conv_item(bob, "Launch crew").get_by_test_id("conv-preview")).to_contain_text(
            "lunch at 2"
        )
        await expect(conv_item(bob, "Launch crew").get_by_test_id("unread-badge")).to_be_hidden()
        await conv_item(bob, "Launch crew").click()
        await expect(row(bob, carol_seq).get_by_test_id("message-text")).to_have_text("lunch at 2")
        await expect(row(bob, carol_seq).get_by_test_id("message-edited")).to_be_visible()

        # -- reactions: the picker adds, a chip toggles mine, counts on both sides -------
        await action(bob, mention_seq, "react-btn")
        picker = row(bob, mention_seq).get_by_test_id("reaction-picker")
        await expect(picker).to_be_visible()
        await shot(bob, shots, "35-reaction-picker")
        await picker.locator('[data-emoji="👍"]').click()
        await expect(picker).to_be_hidden()
        await expect(chip(bob, mention_seq, "👍")).to_have_text("👍1")
        await expect(chip(bob, mention_seq, "👍")).to_have_attribute("data-mine", "true")
        await expect(chip(alice, mention_seq, "👍")).to_have_text("👍1")
        await expect(chip(alice, mention_seq, "👍")).to_have_attribute("data-mine", "false")
        await chip(alice, mention_seq, "👍").click()  # alice adds hers
        for page in (alice, bob):
            await expect(
                chip(page, mention_seq, "👍").get_by_test_id("reaction-count")
            ).to_have_text("2")
        await expect(chip(alice, mention_seq, "👍")).to_have_attribute("data-mine", "true")
        await carol.react(conv, mention_seq, "🎉")  # from a REST client: the notice updates both
        for page in (alice, bob):
            await expect(chip(page, mention_seq, "🎉")).to_have_text("🎉1")
        await shot(alice, shots, "36-reactions")
        await chip(bob, mention_seq, "👍").click()  # bob takes his back
        for page in (alice, bob):
            await expect(
                chip(page, mention_seq, "👍").get_by_test_id("reaction-count")
            ).to_have_text("1")
        await expect(chip(bob, mention_seq, "👍")).to_have_attribute("data-mine", "false")
        await expect(chip(alice, mention_seq, "👍")).to_have_attribute("data-mine", "true")
        m = await stored(bob_c, conv, mention_seq)
        assert m["reactions"] == [
            {"emoji": "🎉", "count": 1, "mine": False},
            {"emoji": "👍", "count": 1, "mine": False},
        ], m

        # the limit (10 reactions of one user on a message) is shown, not swallowed
        for e in ["😀", "😃", "😄", "😁", "😆", "😅", "🤣", "😇", "🙂", "🙃"]:
            await bob_c.react(conv, plain_seq, e)
        await expect(row(bob, plain_seq).get_by_test_id("reaction-chip")).to_have_count(10)
        await action(bob, plain_seq, "react-btn")
        await (
            row(bob, plain_seq)
            .get_by_test_id("reaction-picker")
            .locator('[data-emoji="🔥"]')
            .click()
        )
        toast = bob.locator("#toast")
        await expect(toast).to_be_visible()
        await expect(toast).to_contain_text("Reaction not added")
        await shot(bob, shots, "37-reaction-limit")
        await expect(row(bob, plain_seq).get_by_test_id("reaction-chip")).to_have_count(10)
        # reaction and edit notices never count as unread: carol's cursor is her last
        # send ("lunch at 1"), and only notices came from others after it
        assert all(c["conv_id"] != conv for c in (await carol.unread())["conversations"])
        await bob.get_by_test_id("chat-close").click()
        await carol.react(conv, mention_seq, "👀")
        await bob.wait_for_function(
            """conv => [...window.__im.store.conv(conv).msgs.values()].some(
                (m) => m.content_type === 'reaction' && m.content.emoji === '👀')""",
            arg=conv,
        )
        await expect(conv_item(bob, "Launch crew").get_by_test_id("unread-badge")).to_be_hidden()
        await expect(bob.get_by_test_id("total-unread")).to_be_hidden()
        await expect(chip(alice, mention_seq, "👀")).to_have_text("👀1")
    finally:
        for c in (alice_c, bob_c, carol):
            await c.aclose()


async def test_reply_quote_unavailable_outside_my_window(
    server: Any, new_page: Any, shots: Path
) -> None:
    """Dave joins without history: a reply to a message before he joined reads "message
    unavailable", a reply to one he can see quotes it (fetched: not held by his page)."""
    url = server.url
    owner = await Client.register(url, uname("olga"), PASSWORD)
    dave_name = uname("dave")
    dave_c = await Client.register(url, dave_name, PASSWORD)
    try:
        g = await owner.create_group("Old timers", [])
        conv = g["conv_id"]
        old = int((await owner.send_rest(conv, {"text": "before dave"}))["seq"])
        assert dave_c.user_id is not None
        await owner.add_members(int(g["group_id"]), [dave_c.user_id], with_history=False)
        seen = int((await owner.send_rest(conv, {"text": "welcome dave"}))["seq"])
        for i in range(25):  # more than a sync page carries: "welcome dave" is not held
            await owner.send_rest(conv, {"text": f"filler {i}"})
        await owner.send_rest(conv, {"text": "about the old one"}, reply_to=old)
        await owner.send_rest(conv, {"text": "about the welcome"}, reply_to=seen)

        dave = await new_page("dave")
        await log_in(dave, dave_name, url=url)
        await conv_item(dave, "Old timers").click()
        q_old = message(dave, "about the old one").get_by_test_id("reply-quote")
        await expect(q_old.get_by_test_id("quote-text")).to_have_text("message unavailable")
        await expect(q_old).to_have_attribute("data-state", "unavailable")
        q_seen = message(dave, "about the welcome").get_by_test_id("reply-quote")
        await expect(q_seen.get_by_test_id("quote-text")).to_have_text("welcome dave")
        await expect(q_seen.get_by_test_id("quote-sender")).to_have_text(owner.username or "")
        await shot(dave, shots, "38-reply-unavailable")

        # after clearing, the once visible original is unavailable as well
        await dave_c.clear(conv)
        await owner.send_rest(conv, {"text": "again about the welcome"}, reply_to=seen)
        q_again = message(dave, "again about the welcome").get_by_test_id("quote-text")
        await expect(q_again).to_have_text("message unavailable")
    finally:
        await owner.aclose()
        await dave_c.aclose()


async def test_presence_dots_and_last_seen(server: Any, new_page: Any, shots: Path) -> None:
    """A friend's dot turns on when its socket opens and off, with "last seen", when it
    closes (announced after the offline grace); the page asks GET /v1/presence at start."""
    url = server.url
    alice_name = uname("alice")
    alice_c = await Client.register(url, alice_name, PASSWORD)
    bob = await Client.register(url, uname("bob"), PASSWORD)
    stranger = await Client.register(url, uname("zed"), PASSWORD)
    try:
        conv = await befriend(alice_c, bob)
        assert bob.user_id is not None
        await alice_c.send_rest(conv, {"text": "are you around?"})
        bob_ws = await bob.connect()  # online before the page starts: GET /v1/presence
        page = await new_page("alice")
        await log_in(page, alice_name, url=url)
        friend = page.locator(f'[data-testid="friend"][data-user-id="{bob.user_id}"]')
        await expect(friend.get_by_test_id("presence-dot")).to_have_attribute("data-online", "true")
        item = conv_item(page, bob.username or "")
        await expect(item.get_by_test_id("presence-dot")).to_have_attribute("data-online", "true")
        await item.click()
        await expect(page.get_by_test_id("chat-presence")).to_have_text("online")
        await expect(page.get_by_test_id("chat-presence-dot")).to_have_attribute(
            "data-online", "true"
        )
        await shot(page, shots, "39-presence-online")

        # bob goes away: the presence frame turns everything off, with "last seen"
        await bob_ws.close()
        await expect(page.get_by_test_id("chat-presence")).to_have_text(
            re.compile(r"^last seen "), timeout=PRESENCE_TIMEOUT_MS
        )
        await expect(page.get_by_test_id("chat-presence-dot")).to_have_attribute(
            "data-online", "false"
        )
        await expect(item.get_by_test_id("presence-dot")).to_have_attribute("data-online", "false")
        await expect(friend.get_by_test_id("presence-dot")).to_have_attribute(
            "data-online", "false"
        )
        await expect(friend.get_by_test_id("presence-dot")).to_have_attribute(
            "title", re.compile(r"^last seen ")
        )
        await shot(page, shots, "40-presence-last-seen")

        # and back: a live frame, no reload
        bob_ws = await bob.connect()
        await expect(page.get_by_test_id("chat-presence")).to_have_text(
            "online", timeout=PRESENCE_TIMEOUT_MS
        )
        await expect(item.get_by_test_id("presence-dot")).to_have_attribute("data-online", "true")
        await bob_ws.close()

        # someone who is not my friend: no dot, nothing said
        assert stranger.user_id is not None
        answer = await alice_c.presence([stranger.user_id])
        assert answer == [{"user_id": stranger.user_id, "online": None, "last_seen": None}]
        await expect(
            page.locator(f'[data-testid="friend"][data-user-id="{stranger.user_id}"]')
        ).to_have_count(0)
    finally:
        for c in (alice_c, bob, stranger):
            await c.aclose()
