"""The web client's Content-Security-Policy is in force in the browser: the client runs
under it without a violation (the other browser tests fail on any), and what it forbids,
an inline script or style injected into the page, is blocked and reported."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import CSP_REPORTER, watch
from tests.support import eventually

pytestmark = pytest.mark.timeout(60)

INJECT = """() => {
  const s = document.createElement('script');
  s.textContent = 'window.__injected = true';
  document.body.append(s);
  const div = document.createElement('div');
  div.innerHTML = '<img src="x" onerror="window.__handler = true">';
  document.body.append(div);
  const st = document.createElement('style');
  st.textContent = 'body { background: rgb(255, 0, 0) !important; }';
  document.head.append(st);
}"""


async def test_inline_code_is_blocked(server: Any, browser: Any) -> None:
    ctx = await browser.new_context()
    try:
        await ctx.add_init_script(CSP_REPORTER)
        page = await ctx.new_page()
        problems: list[str] = []
        watch(page, "page", problems)
        response = await page.goto(server.url + "/")
        assert response is not None
        assert "script-src 'self'" in response.headers["content-security-policy"]
        await page.get_by_test_id("auth-screen").wait_for()
        assert problems == [], problems  # the client itself runs clean under the policy

        await page.evaluate(INJECT)
        await page.wait_for_function("() => document.querySelector('img[src=\"x\"]') !== null")
        assert await page.evaluate("window.__injected") is None
        assert await page.evaluate("window.__handler") is None
        background = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background != "rgb(255, 0, 0)"

        async def both_reported() -> bool:
            found = [p for p in problems if "CSP violation" in p]
            return all(any(d in v for v in found) for d in ("script-src", "style-src"))

        await eventually(both_reported, timeout=5)
    finally:
        await ctx.close()
