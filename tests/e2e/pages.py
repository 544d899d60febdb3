"""What the browser tests do on a page, shared by them: names, screenshots, logging in,
finding conversations and messages, sending."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from playwright.async_api import expect  # in the test extras

from tests.support import PASSWORD


def uname(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


async def shot(page: Any, shots: Path, name: str) -> None:
    await page.screenshot(path=str(shots / f"{name}.png"))


async def log_in(
    page: Any, username: str, password: str = PASSWORD, *, url: str | None = None
) -> None:
    """Log in (from the login screen, or after opening ``url``) and wait for the chat
    screen, connected."""
    if url is not None:
        await page.goto(url + "/")
    await expect(page.get_by_test_id("auth-screen")).to_be_visible()
    await page.get_by_test_id("auth-username").fill(username)
    await page.get_by_test_id("auth-password").fill(password)
    await page.get_by_test_id("login-btn").click()
    await expect(page.get_by_test_id("my-id")).to_have_text(re.compile(r"my id: \d+"))
    await expect(page.get_by_test_id("offline-banner")).to_be_hidden()


def conv_item(page: Any, title: str) -> Any:
    return page.get_by_test_id("conv-item").filter(
        has=page.get_by_test_id("conv-title").get_by_text(title, exact=True)
    )


def message(page: Any, text: str) -> Any:
    return page.get_by_test_id("message").filter(
        has=page.get_by_test_id("message-text").get_by_text(text, exact=True)
    )


def my_message(page: Any, text: str) -> Any:
    return page.locator('[data-testid="message"][data-mine="true"]').filter(
        has=page.get_by_test_id("message-text").get_by_text(text, exact=True)
    )


async def sent_seq(page: Any, text: str) -> int:
    """The seq of my message with this text, once acked."""
    mine = my_message(page, text)
    await expect(mine).to_have_attribute("data-seq", re.compile(r"\d+"))
    return int(await mine.get_attribute("data-seq"))


async def send(page: Any, text: str) -> int:
    """Type and send ``text`` in the open conversation; its seq once acked."""
    box = page.get_by_test_id("composer")
    await box.fill(text)
    await box.press("Enter")
    return await sent_seq(page, text)
