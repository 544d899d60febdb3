"""Web Push, with no tab open: the page registers its service worker and its push
subscription with the server as the contract's ``webpush`` platform (the VAPID key
from GET /v1/push/config; endpoint and auth as data); a message that comes while no tab
is open reaches the gateway with that data; the payload a gateway's Web Push sender
makes of it (Sygnal's webpush pushkin: the notification's fields, flattened counts),
delivered to the service worker, shows the same notification as the page: the sender,
a preview, the chat to open on a click.

Headless Chromium has no push service: ``pushManager.subscribe`` is replaced by one
that answers a fixed subscription (and records the key it was given), and the push is
delivered to the service worker through the DevTools protocol
(``ServiceWorker.deliverPushMessage``), as the browser's push service would."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect  # in the test extras

from im_server.bench.push_gateway import RecordingGateway
from im_server.client import Client
from tests.e2e.conftest import watch
from tests.e2e.pages import log_in, uname
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    vapid_public_key,
)

pytestmark = pytest.mark.timeout(240)
expect.set_options(timeout=10_000)

WEB_APP = "com.example.im.web"
ENDPOINT = "https://push.example.net/send/e2e-subscription"
P256DH = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
AUTH = "k8JV6sjdbhAi-n3NdbKeKQ"
# a subscription the browser kept from before the server's VAPID keys were replaced
OLD_ENDPOINT = "https://push.example.net/send/e2e-old-subscription"
OLD_P256DH = (
    "BOLDRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
)

# the browser's push service, as far as the page can tell: a subscription outlives the
# page (kept in the origin's storage, as the browser keeps it), and the browser's
# refusals (no active worker; another server key while one exists) are kept
STORE = "__fakePushSubscription"
FAKE_SUBSCRIPTION = f"""
window.__subscribedWith = null;
window.__unsubscribed = 0;
const STORE = {json.dumps(STORE)};
const b64u = (bytes) => btoa(String.fromCharCode(...bytes))
  .replace(/\\+/g, '-').replace(/\\//g, '_').replace(/=+$/, '');
const unb64u = (text) => Uint8Array.from(
  atob(text.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - text.length % 4) % 4)),
  (ch) => ch.charCodeAt(0));
const stored = () => JSON.parse(localStorage.getItem(STORE) || 'null');
function current() {{
  const s = stored();
  if (!s) return null;
  return {{
    endpoint: s.endpoint,
    options: {{ userVisibleOnly: true, applicationServerKey: unb64u(s.key).buffer }},
    toJSON() {{ return {{endpoint: s.endpoint, keys: {{p256dh: s.p256dh, auth: {json.dumps(AUTH)}}}}}; }},
    unsubscribe: async () => {{ localStorage.removeItem(STORE); window.__unsubscribed += 1; return true; }},
  }};
}}
PushManager.prototype.subscribe = async function (opts) {{
  const reg = await navigator.serviceWorker.getRegistration();
  if (!reg || !reg.active) throw new DOMException('Subscription failed - no active Service Worker', 'AbortError');
  const key = b64u(new Uint8Array(opts.applicationServerKey));
  const old = stored();
  if (old && old.key !== key) {{
    throw new DOMException('A subscription with a different application server key already exists.', 'InvalidStateError');
  }}
  window.__subscribedWith = key;
  if (!old) localStorage.setItem(STORE, JSON.stringify({{key, endpoint: {json.dumps(ENDPOINT)}, p256dh: {json.dumps(P256DH)}}}));
  return current();
}};
PushManager.prototype.getSubscription = async function () {{ return current(); }};
"""


VAPID = vapid_public_key()


@pytest.fixture(scope="module")
def gateway() -> Iterator[RecordingGateway]:
    gw = RecordingGateway().start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def webpush_server(
    tmp_path_factory: pytest.TempPathFactory, gateway: RecordingGateway
) -> Iterator[ServerProcess]:
    """A server on stores of its own, with a push gateway and Web Push configured."""
    stores = Stores.start(tmp_path_factory.mktemp("webpush-stores"))
    srv = ServerProcess(
        env={
            **stores.env(),
            "IM_PUSH_GATEWAY_URL": gateway.url,
            "IM_PUSH_POLL_SECONDS": "0.2",
            "IM_WEBPUSH_APP_ID": WEB_APP,
            "IM_WEBPUSH_VAPID_PUBLIC_KEY": VAPID,
        }
    ).start()
    yield srv
    srv.terminate()
    stores.stop()


def sygnal_payload(n: dict[str, Any]) -> dict[str, Any]:
    """What a gateway's Web Push sender sends the browser for a notification (Sygnal's
    webpush pushkin: these fields when present, the counts flattened, the content)."""
    keys = ("room_id", "room_name", "event_id", "sender", "sender_display_name", "type")
    out: dict[str, Any] = {k: n[k] for k in keys if n.get(k)}
    out.update(n.get("counts") or {})
    if isinstance(n.get("content"), dict):
        out["content"] = n["content"]
    return out


async def webpush_registrations(c: Client) -> list[dict[str, Any]]:
    return [r for r in await c.push_registrations() if r["platform"] == "webpush"]


async def logged_in_tab(
    ctx: Any, url: str, username: str, problems: list[str], *, kept: dict[str, str] | None = None
) -> Any:
    """A tab of ``ctx`` logged in as ``username``, notifications allowed, on the stand-in
    push service; with ``kept``, the subscription the browser kept from before (set once
    per tab, so that a reload finds what the page left)."""
    await ctx.grant_permissions(["notifications"], origin=url)
    if kept is not None:
        await ctx.add_init_script(
            f"if (location.origin === {json.dumps(url)} && !sessionStorage.getItem('seeded')) {{"
            " sessionStorage.setItem('seeded', '1');"
            f" localStorage.setItem({json.dumps(STORE)}, {json.dumps(json.dumps(kept))}); }}"
        )
    await ctx.add_init_script(FAKE_SUBSCRIPTION)
    page = await ctx.new_page()
    watch(page, username, problems)
    await log_in(page, username, url=url)
    return page


async def test_web_push_with_no_tab_open(
    browser: Any, webpush_server: ServerProcess, gateway: RecordingGateway, shots: Path
) -> None:
    url = webpush_server.url
    alice = uname("alice")
    a = await Client.register(url, alice, PASSWORD)
    b = await Client.register(url, uname("bob"), PASSWORD)
    conv = await befriend(a, b)
    ctx = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        problems: list[str] = []
        page = await logged_in_tab(ctx, url, alice, problems)

        # the subscription, with the server's VAPID key, registered as webpush
        [reg] = await eventually(lambda: webpush_registrations(a), timeout=15)
        assert reg["app_id"] == WEB_APP and reg["pushkey"] == P256DH
        assert reg["data"] == {"endpoint": ENDPOINT, "auth": AUTH, "events_only": True}
        assert await page.evaluate("window.__subscribedWith") == VAPID
        await expect(page.get_by_test_id("notify-btn")).to_be_hidden()  # allowed already

        # no tab open: the message goes to the gateway, with the subscription's data
        await page.close()
        await asyncio.sleep(0.5)
        ack = await b.send_rest(conv, "are you there? no tab is open")
        [got] = await eventually(lambda: gateway.for_keys([P256DH]), timeout=15)
        n = got.notification
        assert n["event_id"] == f"{conv}/{ack['seq']}"
        assert n["devices"] == [{"app_id": WEB_APP, "pushkey": P256DH, "data": reg["data"]}]

        # the browser's push service hands the payload to the service worker
        blank = await ctx.new_page()
        cdp = await ctx.new_cdp_session(blank)
        regs: dict[str, str] = {}
        cdp.on(
            "ServiceWorker.workerRegistrationUpdated",
            lambda e: regs.update({r["scopeURL"]: r["registrationId"] for r in e["registrations"]}),
        )
        active: set[str] = set()
        cdp.on(
            "ServiceWorker.workerVersionUpdated",
            lambda e: active.update(
                v["registrationId"] for v in e["versions"] if v["status"] == "activated"
            ),
        )
        await cdp.send("ServiceWorker.enable")
        scope = url + "/"
        await eventually(lambda: scope in regs, timeout=10)
        await eventually(lambda: regs[scope] in active, timeout=10)  # a push has a worker
        await cdp.send(
            "ServiceWorker.deliverPushMessage",
            {
                "origin": url,
                "registrationId": regs[scope],
                "data": json.dumps(sygnal_payload(n)),
            },
        )

        async def shown() -> list[dict[str, Any]]:
            for w in ctx.service_workers:
                if w.url.endswith("/sw.js"):
                    got: list[dict[str, Any]] = await w.evaluate(
                        "self.registration.getNotifications().then(ns => ns.map("
                        "n => ({title: n.title, body: n.body, tag: n.tag, data: n.data})))"
                    )
                    return got
            return []

        [note] = await eventually(shown, timeout=10)
        assert note == {
            "title": b.username,
            "body": "are you there? no tab is open",
            "tag": f"{conv}/{ack['seq']}",
            "data": {"conv_id": conv},
        }
        assert not problems, "errors in the web client:\n" + "\n".join(problems)
    finally:
        await ctx.close()
        for c in (a, b):
            await c.aclose()


async def test_web_push_subscription_follows_a_new_server_key(
    browser: Any, webpush_server: ServerProcess
) -> None:
    """The browser keeps a subscription across visits. One made for another server key
    (the server's VAPID keys were replaced) would have every push the gateway signs
    refused by the push service, and the browser refuses a second subscription beside
    it: the page drops it and subscribes anew with the current key. One made with the
    current key is kept as it is."""
    url = webpush_server.url
    alice = uname("alice")
    a = await Client.register(url, alice, PASSWORD)
    old = {"key": vapid_public_key(), "endpoint": OLD_ENDPOINT, "p256dh": OLD_P256DH}
    ctx = await browser.new_context()
    try:
        problems: list[str] = []
        page = await logged_in_tab(ctx, url, alice, problems, kept=old)
        # the first registration the server saw
        [reg] = await eventually(lambda: webpush_registrations(a), timeout=15)
        assert reg["pushkey"] == P256DH
        assert reg["data"] == {"endpoint": ENDPOINT, "auth": AUTH, "events_only": True}
        assert await page.evaluate("window.__unsubscribed") == 1
        assert await page.evaluate("window.__subscribedWith") == VAPID

        # the next visit finds a subscription with the current key: kept, registered again
        async with page.expect_request(
            lambda r: r.url.endswith("/v1/push/registration") and r.method == "PUT"
        ) as put:
            await page.reload()
        body = (await put.value).post_data_json
        assert body["pushkey"] == P256DH and body["data"]["endpoint"] == ENDPOINT
        await expect(page.get_by_test_id("my-id")).to_have_text(re.compile(r"my id: \d+"))
        assert await page.evaluate("window.__unsubscribed") == 0
        assert await page.evaluate("window.__subscribedWith") is None
        assert [r["pushkey"] for r in await webpush_registrations(a)] == [P256DH]
        assert not problems, "errors in the web client:\n" + "\n".join(problems)
    finally:
        await ctx.close()
        await a.aclose()
