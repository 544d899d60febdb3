"""Browser fixtures: Debian's Chromium driven by Playwright (the Playwright browser
download is not used). Set IM_CHROMIUM to another executable. A missing browser fails
the tests: `scripts/test` installs Chromium and the test extras install Playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def _chromium() -> str | None:
    for cand in (
        os.environ.get("IM_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        shutil.which("google-chrome"),
    ):
        if cand and os.path.exists(cand):
            return cand
    return None


def _unavailable(reason: str) -> None:
    pytest.fail(reason)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    exe = _chromium()
    if exe is None:
        _unavailable("no Chromium found (apt-get install chromium, or set IM_CHROMIUM)")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        await b.close()


@pytest.fixture(scope="module")
def shots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


NewPage = Callable[..., Awaitable[Any]]


@pytest.fixture
async def new_page(browser: Any) -> AsyncIterator[NewPage]:
    """``await new_page("alice")``: a page in its own browser context (own storage, own
    network switch). JavaScript errors on any page fail the test at teardown."""
    contexts: list[Any] = []
    errors: list[str] = []

    async def make(name: str, *, width: int = 1280, height: int = 800) -> Any:
        ctx = await browser.new_context(viewport={"width": width, "height": height})
        ctx.set_default_timeout(15_000)
        contexts.append(ctx)
        page = await ctx.new_page()
        page.on("pageerror", lambda e: errors.append(f"{name}: {e}"))
        return page

    yield make
    for ctx in contexts:
        await ctx.close()
    assert not errors, "JavaScript errors in the web client:\n" + "\n".join(errors)
