"""Browser fixtures: Debian's Chromium driven by Playwright (the Playwright browser
download is not used). Set IM_CHROMIUM to another executable. A missing browser fails
the tests: `scripts/test` installs Chromium and the test extras install Playwright."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


# reports every Content-Security-Policy violation on the console, where the listener
# below sees it (Chromium logs most violations there itself, but not all of them)
CSP_REPORTER = """document.addEventListener('securitypolicyviolation', (e) => {
  console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`);
});"""


# what Chromium logs for requests made while a test has switched the network off
OFFLINE = "net::ERR_INTERNET_DISCONNECTED"
# what Chromium logs for every answer with an error status, whatever the page does with it
FAILED_LOAD = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")

# (status, path prefix): answers a test provokes on purpose, e.g. (401, "/v1/me/password")
HttpErrors = Collection[tuple[int, str]]


def _provoked(message: Any, http_errors: HttpErrors) -> bool:
    m = FAILED_LOAD.match(message.text)
    if not m or not http_errors:
        return False
    path = urlsplit((message.location or {}).get("url", "")).path
    return any(int(m[1]) == st and path.startswith(prefix) for st, prefix in http_errors)


def watch(page: Any, name: str, problems: list[str], http_errors: HttpErrors = ()) -> None:
    """Record JavaScript errors and console errors and warnings (CSP violations among
    them) of ``page`` in ``problems``; requests refused because the test switched the
    network off are expected, and so are the error answers listed in ``http_errors``."""

    def on_console(message: Any) -> None:
        if message.type not in ("error", "warning") or OFFLINE in message.text:
            return
        if not _provoked(message, http_errors):
            problems.append(f"{name}: console {message.type}: {message.text}")

    page.on("pageerror", lambda e: problems.append(f"{name}: {e}"))
    page.on("console", on_console)


@pytest.fixture
async def new_page(browser: Any) -> AsyncIterator[NewPage]:
    """``await new_page("alice")``: a page in its own browser context (own storage, own
    network switch). JavaScript errors, console errors and warnings, and CSP violations
    on any page fail the test at teardown. ``http_errors`` lists the (status, path
    prefix) answers the test provokes on that page (Chromium logs each as an error)."""
    contexts: list[Any] = []
    problems: list[str] = []

    async def make(
        name: str, *, width: int = 1280, height: int = 800, http_errors: HttpErrors = ()
    ) -> Any:
        ctx = await browser.new_context(viewport={"width": width, "height": height})
        ctx.set_default_timeout(15_000)
        await ctx.add_init_script(CSP_REPORTER)
        contexts.append(ctx)
        page = await ctx.new_page()
        watch(page, name, problems, http_errors)
        return page

    yield make
    for ctx in contexts:
        await ctx.close()
    assert not problems, "errors in the web client:\n" + "\n".join(problems)


AXE_DIR = Path(__file__).resolve().parent / "axe"
AXE_JS = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"


@pytest.fixture(scope="session")
def axe_source() -> str:
    """axe-core's script, installed from npm (``tests/e2e/axe/package-lock.json``) with
    the test extras' Node on first use; a lock keeps parallel workers from installing it
    twice at once."""
    import fcntl

    from tests.sdk.test_typescript_sdk import _run, node_for_tests

    with open(AXE_DIR / "package.json", "rb") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not AXE_JS.exists():
            _, npm, env = node_for_tests()
            _run([*npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], env, 300, AXE_DIR)
    return AXE_JS.read_text(encoding="utf-8")
