"""Devices & security in the web client, in a real browser against a real ``im-server
serve``: one person logged in on two devices (two browser contexts) sees both sessions,
logs the other device out, changes the password, logs out everywhere; the device whose
session ends returns to the login screen with a message and stays there.

Screenshots of each step go to ``test-artifacts/screenshots/``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import expect  # in the test extras

from im_server.client import Client
from im_server.client.transport import HttpPool
from tests.e2e.pages import conv_item, log_in, shot, uname
from tests.support import PASSWORD, befriend, eventually, persisted, send_ok

pytestmark = pytest.mark.timeout(120)
expect.set_options(timeout=10_000)

LOGGED_OUT = "You were logged out"
NEW_PASSWORD = "a brand new passphrase"
# A device whose session ends under it may have a request in flight, answered 401 (the
# client handles it like the socket's close 4401), and at boot its stored token is
# checked with GET /v1/me: Chromium logs each such answer as a console error.
REVOKED = [(401, "/v1/")]


async def create_user(url: str) -> str:
    username = uname("dana")
    async with HttpPool(base_url=url, timeout=10) as http:
        r = await http.post("/v1/users", json={"username": username, "password": PASSWORD})
        r.raise_for_status()
    return username


async def device(page: Any) -> str:
    return await page.evaluate("localStorage.getItem('im.device')")


async def open_panel(page: Any) -> Any:
    await page.get_by_role("button", name="Devices & security").click()
    dialog = page.get_by_test_id("sessions-dialog")
    await expect(dialog).to_be_visible()
    await expect(page.get_by_test_id("session").first).to_be_visible()  # loaded
    return dialog


def session_row(page: Any, device_id: str) -> Any:
    return page.locator(f'[data-testid="session"][data-device-id="{device_id}"]')


async def expect_logged_out(page: Any) -> None:
    await expect(page.get_by_test_id("auth-screen")).to_be_visible()
    await expect(page.get_by_test_id("auth-error")).to_contain_text(LOGGED_OUT)
    await expect(page.get_by_test_id("auth-password")).to_have_value("")
    assert await page.evaluate("localStorage.getItem('im.session')") is None


async def test_devices_panel_logs_out_another_device(
    server: Any, new_page: Any, shots: Path
) -> None:
    url = server.url
    name = await create_user(url)
    laptop = await new_page("laptop")
    phone = await new_page("phone", http_errors=REVOKED)
    for page in (laptop, phone):
        await page.goto(url + "/")
        await log_in(page, name)
    laptop_id, phone_id = await device(laptop), await device(phone)
    assert laptop_id != phone_id

    # -- both sessions, this device first and marked -----------------------------------
    await open_panel(laptop)
    rows = laptop.get_by_test_id("session")
    await expect(rows).to_have_count(2)
    await expect(rows.first).to_have_attribute("data-device-id", laptop_id)
    mine, other = session_row(laptop, laptop_id), session_row(laptop, phone_id)
    await expect(mine).to_have_attribute("data-current", "true")
    await expect(mine.get_by_test_id("this-device")).to_have_text("this device")
    await expect(mine.get_by_test_id("session-times")).to_contain_text("Active now")
    await expect(mine.get_by_test_id("session-logout")).to_have_count(0)
    await expect(other).to_have_attribute("data-current", "false")
    await expect(other.get_by_test_id("this-device")).to_have_count(0)
    # named by browser and platform (the login's User-Agent), the device id beside it
    for row in (mine, other):
        await expect(row.get_by_test_id("session-device")).to_have_text(
            re.compile(r"^\S*Chrom\S* on Linux$")
        )
    await expect(other.get_by_test_id("session-id")).to_have_text(f"device {phone_id}")
    await expect(other.get_by_test_id("session-times")).to_contain_text(
        re.compile(r"Last active just now · logged in .+")
    )
    await shot(laptop, shots, "20-devices-panel")

    # -- log the phone out: it returns to the login screen and stays there -------------
    sockets: list[str] = []
    calls: list[str] = []
    phone.on("websocket", lambda ws: sockets.append(ws.url))
    phone.on("request", lambda r: calls.append(r.url) if "/v1/" in r.url else None)
    await other.get_by_role("button", name=re.compile(f"Log out .*{phone_id}")).click()
    await expect(rows).to_have_count(1)
    await expect(phone.get_by_test_id("auth-screen")).to_be_visible()
    await expect_logged_out(phone)
    await shot(phone, shots, "21-phone-logged-out")
    await expect(laptop.get_by_test_id("offline-banner")).to_be_hidden()  # still in
    seen = (len(sockets), len(calls))
    await phone.wait_for_timeout(1500)  # the first reconnect would come within 300 ms
    assert (len(sockets), len(calls)) == seen, (sockets, calls)

    # -- it logs in again on the same page ----------------------------------------------
    await log_in(phone, name)
    await laptop.get_by_test_id("sessions-dialog").get_by_role("button", name="Close").click()
    await open_panel(laptop)
    await expect(rows).to_have_count(2)

    # -- revoked while the page is closed: the stored token is refused at the next start -
    await phone.goto("about:blank")
    await session_row(laptop, phone_id).get_by_test_id("session-logout").click()
    await expect(rows).to_have_count(1)
    await phone.goto(url + "/")
    await expect_logged_out(phone)


async def test_change_password_logs_out_the_other_device(
    server: Any, new_page: Any, shots: Path
) -> None:
    url = server.url
    name = await create_user(url)
    # a wrong current password is answered 401, the throttle 429 (simulated below)
    laptop = await new_page(
        "laptop", http_errors=[(401, "/v1/me/password"), (429, "/v1/me/password")]
    )
    phone = await new_page("phone", http_errors=REVOKED)
    for page in (laptop, phone):
        await page.goto(url + "/")
        await log_in(page, name)
    await open_panel(laptop)
    await expect(laptop.get_by_test_id("session")).to_have_count(2)
    old, new, confirm = (laptop.get_by_test_id(f"pw-{k}") for k in ("old", "new", "confirm"))
    submit = laptop.get_by_test_id("password-submit")
    error, ok = laptop.get_by_test_id("password-error"), laptop.get_by_test_id("password-ok")

    async def change(current: str, new_password: str, again: str) -> None:
        await old.fill(current)
        await new.fill(new_password)
        await confirm.fill(again)
        await submit.click()

    # -- checked in the page first: nothing is sent -------------------------------------
    sent: list[str] = []
    laptop.on("request", lambda r: sent.append(r.method) if "/v1/me/password" in r.url else None)
    await change(PASSWORD, "short", "short")
    await expect(error).to_have_text("The new password needs at least 8 characters.")
    await change(PASSWORD, NEW_PASSWORD, NEW_PASSWORD + "!")
    await expect(error).to_have_text("The new passwords do not match.")
    assert sent == []

    # -- a wrong current password: said in the form, and this device stays logged in ---
    await change("not my password", NEW_PASSWORD, NEW_PASSWORD)
    await expect(error).to_have_text("Your current password is wrong.")
    await expect(ok).to_be_hidden()
    await expect(laptop.get_by_test_id("sessions-dialog")).to_be_visible()
    await expect(laptop.get_by_test_id("auth-screen")).to_be_hidden()
    await shot(laptop, shots, "22-password-wrong")

    # -- too many attempts (the test server's throttle is set out of reach: simulated) --
    async def throttled(route: Any) -> None:
        body = {"error": {"code": "rate_limited", "message": "too many failed logins"}}
        await route.fulfill(status=429, json=body)

    await laptop.route("**/v1/me/password", throttled)
    await change("not my password", NEW_PASSWORD, NEW_PASSWORD)
    await expect(error).to_have_text("Too many wrong passwords. Wait a few minutes and try again.")
    await laptop.unroute("**/v1/me/password", throttled)
    assert sent == ["PUT", "PUT"]

    # -- the right one: done, and the phone is logged out -------------------------------
    await change(PASSWORD, NEW_PASSWORD, NEW_PASSWORD)
    await expect(ok).to_have_text("Password changed. Your other devices were logged out.")
    await expect(error).to_have_text("")
    await expect(old).to_have_value("")
    await expect(laptop.get_by_test_id("session")).to_have_count(1)
    await expect_logged_out(phone)
    await shot(laptop, shots, "23-password-changed")
    await shot(phone, shots, "24-phone-after-password-change")

    # this device kept its session; the phone gets in with the new password
    await expect(laptop.get_by_test_id("offline-banner")).to_be_hidden()
    await laptop.reload()
    await expect(laptop.get_by_test_id("my-id")).to_be_visible()
    await log_in(phone, name, NEW_PASSWORD)


async def test_log_out_everywhere(server: Any, new_page: Any, shots: Path) -> None:
    url = server.url
    name = await create_user(url)
    laptop = await new_page("laptop", http_errors=REVOKED)  # its own session ends too
    phone = await new_page("phone", http_errors=REVOKED)
    for page in (laptop, phone):
        await page.goto(url + "/")
        await log_in(page, name)
    await open_panel(laptop)
    await expect(laptop.get_by_test_id("session")).to_have_count(2)

    asked: list[str] = []

    async def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        await dialog.accept()

    laptop.once("dialog", accept)
    async with laptop.expect_navigation():  # logging out reloads the page: a clean slate
        await laptop.get_by_test_id("logout-everywhere-btn").click()
    assert asked == ["Log out on every device, this one included?"]
    await expect(laptop.get_by_test_id("auth-screen")).to_be_visible()
    assert await laptop.evaluate("localStorage.getItem('im.session')") is None
    await expect_logged_out(phone)
    await shot(laptop, shots, "25-logged-out-everywhere")

    # both tokens are dead: reloading the phone keeps it on the login screen
    await phone.reload()
    await expect(phone.get_by_test_id("auth-screen")).to_be_visible()


async def test_delete_my_account(server: Any, new_page: Any, shots: Path) -> None:
    """In-app deletion (the app stores require it): a wrong password is refused and
    changes nothing; the right one, confirmed, deletes the account, the page goes back to
    the login screen, logging in fails and the username can be registered again."""
    url = server.url
    name = await create_user(url)
    page = await new_page("deleter", http_errors=REVOKED)  # the wrong password is a 401
    await page.goto(url + "/")
    await log_in(page, name)
    await open_panel(page)
    asked: list[str] = []

    async def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        await dialog.accept()

    page.on("dialog", accept)
    await page.get_by_test_id("delete-password").fill("not my password")
    await page.get_by_test_id("delete-submit").click()
    await expect(page.get_by_test_id("delete-error")).to_have_text("Your password is wrong.")
    await shot(page, shots, "26-delete-account-wrong-password")
    await page.get_by_test_id("delete-password").fill(PASSWORD)
    await page.get_by_test_id("delete-submit").click()
    await expect(page.get_by_test_id("auth-screen")).to_be_visible()

    async def session_forgotten() -> bool:
        try:
            return await page.evaluate("localStorage.getItem('im.session')") is None
        except PlaywrightError:  # the page reloads after the deletion: ask the new one
            return False

    await eventually(session_forgotten, timeout=10)
    assert asked == ["Delete your account for good? This cannot be undone."] * 2
    async with HttpPool(base_url=url, timeout=10) as http:
        r = await http.post("/v1/sessions", json={"username": name, "password": PASSWORD})
        assert r.status_code == 401, r.text
        r = await http.post("/v1/users", json={"username": name, "password": PASSWORD})
        assert r.status_code == 201, r.text  # the name is free again


async def test_a_deleted_friend_is_shown_as_deleted(
    server: Any, new_page: Any, shots: Path
) -> None:
    """Messages of a deleted account stay for the others, their sender shown as a deleted
    account (it has no username any more), looked up once, not again on every render."""
    names = {k: uname(k) for k in ("erin", "finn")}
    erin = await Client.register(server.url, names["erin"], PASSWORD)
    finn = await Client.register(server.url, names["finn"], PASSWORD)
    try:
        conv = await befriend(erin, finn)
        seq = await send_ok(erin, conv, "goodbye, and thanks")
        await persisted(finn, conv, seq)
        await erin.delete_account(PASSWORD)
        page = await new_page("finn")
        lookups: list[str] = []
        page.on(
            "request",
            lambda r: lookups.append(r.url) if f"/v1/users/{erin.user_id}" in r.url else None,
        )
        await log_in(page, names["finn"], url=server.url)
        item = conv_item(page, "Deleted account")
        await expect(item).to_have_count(1)
        await item.click()
        await expect(page.get_by_test_id("chat-title")).to_have_text("Deleted account")
        # the message stays (a single chat shows no sender line: the title names the peer)
        await expect(
            page.get_by_test_id("message").filter(has_text="goodbye, and thanks")
        ).to_have_count(1)
        await shot(page, shots, "27-deleted-friend")
        assert len(lookups) == 1, lookups
    finally:
        await erin.aclose()
        await finn.aclose()
