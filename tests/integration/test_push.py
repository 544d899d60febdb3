"""Pushes to phones (PROTOCOL.md, "Push notifications to phones"), end to end: a server
with a push gateway configured posts to a real HTTP gateway in this process
(:class:`RecordingGateway`), and each rule is checked on what arrives there.

The push-enabled server runs on stores of its own (``push_stores``); the tests of the
module share it and its gateway, so each looks only at its own pushkeys."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from im_server.bench.push_gateway import Received, RecordingGateway
from im_server.client import Client
from im_server.client.wire import single_conv_id
from im_server.storage.redis import keys
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    metric,
    new_user,
    persisted,
    pg,
    rds,
)

APP = "com.example.im.ios"
# quick enough for tests: a failing gateway is retried within a second, work found
# within a fifth of one
PUSH_ENV = {
    "IM_PUSH_BACKOFF_MAX_SECONDS": "1",
    "IM_PUSH_POLL_SECONDS": "0.2",
    "IM_PUSH_LEASE_SECONDS": "5",
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[RecordingGateway]:
    gw = RecordingGateway().start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def pushing(push_stores: Stores, gateway: RecordingGateway) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        env={**push_stores.env(), **PUSH_ENV, "IM_PUSH_GATEWAY_URL": gateway.url}
    ).start()
    yield srv
    srv.terminate()


@pytest.fixture
async def users(pushing: ServerProcess) -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        await c.aclose()


def pushkey() -> str:
    return secrets.token_hex(32)


async def user(made: list[Client], srv: ServerProcess, prefix: str) -> Client:
    c = await new_user(srv.url, prefix)
    made.append(c)
    return c


async def phone(made: list[Client], c: Client, device: str = "phone") -> tuple[Client, str]:
    """Another session of ``c`` (a phone that is not connected) with a push registration;
    (that session, its pushkey)."""
    p = await Client.login(c.base_url, c.username or "", PASSWORD, device_id=device)
    made.append(p)
    key = pushkey()
    await p.register_push(APP, key, "apns")
    return p, key


async def arrivals(
    gw: RecordingGateway, key: str, n: int, timeout: float = 10.0, messages: bool = True
) -> list[Received]:
    """Wait until ``n`` notifications reached ``key`` (message pushes, or badge-only
    ones with ``messages=False``); all of them."""

    def got() -> list[Received]:
        rs = gw.for_keys([key], lambda r: ("event_id" in r.notification) == messages)
        return rs if len(rs) >= n else []

    return await eventually(got, timeout=timeout)


def event_ids(rs: list[Received]) -> list[str]:
    return [r.notification["event_id"] for r in rs]


async def pair(made: list[Client], srv: ServerProcess) -> tuple[Client, Client, str]:
    a = await user(made, srv, "pa")
    b = await user(made, srv, "pb")
    await befriend(a, b)
    assert a.user_id is not None and b.user_id is not None
    return a, b, single_conv_id(a.user_id, b.user_id)


async def test_a_message_is_pushed_to_the_offline_device_in_the_gateway_format(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    a, b, conv = await pair(users, pushing)
    _, key = await phone(users, b)
    t0 = time.time()
    ack = await a.send_rest(conv, "hello phone")
    [r] = await arrivals(gateway, key, 1)
    n = r.notification
    assert n == {
        "event_id": f"{conv}/{ack['seq']}",
        "room_id": conv,
        "type": "message",
        "sender": str(a.user_id),
        "sender_display_name": a.username,
        "content": {"text": "hello phone"},
        "counts": {"unread": 1},
        "prio": "high",
        "devices": [{"app_id": APP, "pushkey": key, "data": {}}],
    }
    assert r.at - t0 < 5.0, "posted within 5 s of the ack"
    assert gateway.invalid == 0


async def test_a_browser_subscription_reaches_the_gateway_with_its_data(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    """Web Push: the registration's data (the subscription's endpoint and auth) is what
    the gateway gets as the device's data, which its Web Push sender needs."""
    a, b, conv = await pair(users, pushing)
    browser = await Client.login(b.base_url, b.username or "", PASSWORD, device_id="browser")
    users.append(browser)
    key = "B" + secrets.token_urlsafe(64)[:86]
    data = {
        "endpoint": "https://push.example.net/s/" + secrets.token_hex(8),
        "auth": "k8JV6sjdbhAi-n3NdbKeKQ",
    }
    await browser.register_push("com.example.im.web", key, "webpush", data)
    ack = await a.send_rest(conv, "hello browser")
    [r] = await arrivals(gateway, key, 1)
    assert r.notification["event_id"] == f"{conv}/{ack['seq']}"
    assert r.notification["devices"] == [
        {"app_id": "com.example.im.web", "pushkey": key, "data": data}
    ]


async def device_connected(stores: Stores, c: Client, device: str) -> bool:
    """Whether the presence registry lists ``device`` of ``c`` as connected somewhere."""
    async with rds(stores) as r:
        held = await r.hgetall(keys.presence_devices(c.user_id or 0))
    return any(device in v.split(" ") for v in held.values())


async def test_no_push_to_the_sender_nor_to_a_connected_device(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway, push_stores: Stores
) -> None:
    stores = push_stores
    a, b, conv = await pair(users, pushing)
    _, a_key = await phone(users, a)  # the sender's own phone
    online, online_key = await phone(users, b, "tablet")
    _, offline_key = await phone(users, b, "phone")
    ws = await online.connect()
    await eventually(lambda: device_connected(stores, b, "tablet"))
    seq = (await a.send_rest(conv, "one"))["seq"]
    [got] = await arrivals(gateway, offline_key, 1)
    assert got.notification["event_id"] == f"{conv}/{seq}"
    assert got.pushkeys == [offline_key], "only the device with no open connection"
    await ws.close()
    await eventually(lambda: _not(device_connected(stores, b, "tablet")))
    # once the tablet's connection closed, a message reaches both of b's devices
    seq2 = (await a.send_rest(conv, "two"))["seq"]
    [r2] = await arrivals(gateway, online_key, 1)
    assert r2.notification["event_id"] == f"{conv}/{seq2}"
    assert sorted(r2.pushkeys) == sorted([online_key, offline_key])
    assert gateway.for_keys([a_key]) == [], "the sender's devices get nothing"


async def _not(aw: Any) -> bool:
    return not await aw


async def test_a_burst_carries_the_badge_right_after_each_message(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    a, b, conv = await pair(users, pushing)
    c = await user(users, pushing, "pc")
    await befriend(c, b)
    _, key = await phone(users, b)
    # a burst long enough that rounds overlap the persister's writes: the badge and the
    # messages after the pushed one are read in one snapshot, so none comes out short
    seqs = [(await a.send_rest(conv, f"m{i}"))["seq"] for i in range(8)]
    rs = await arrivals(gateway, key, 8)
    got = sorted((r.notification["event_id"], r.notification["counts"]["unread"]) for r in rs)
    assert got == sorted((f"{conv}/{s}", i + 1) for i, s in enumerate(seqs))
    # a message in another conversation counts the unread of both
    other = single_conv_id(c.user_id or 0, b.user_id or 0)
    s4 = (await c.send_rest(other, "from c"))["seq"]
    [r4] = [r for r in await arrivals(gateway, key, 9) if r.notification["room_id"] == other]
    assert r4.notification["event_id"] == f"{other}/{s4}"
    assert r4.notification["counts"] == {"unread": 9}
    assert (await b.unread())["badge"] == 9, "the badge GET /v1/unread answers"


async def test_a_muted_conversation_is_pushed_only_when_it_mentions_me(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    owner = await user(users, pushing, "po")
    b = await user(users, pushing, "pm")
    g = await owner.create_group("muted", [b.user_id or 0])
    conv = str(g["conv_id"])
    _, key = await phone(users, b)
    await b.conversation_settings(conv, muted=True)
    plain = (await owner.send_rest(conv, "nobody in particular"))["seq"]
    mention = (await owner.send_rest(conv, "@b look", mentions=[b.user_id or 0]))["seq"]
    everyone = (await owner.send_rest(conv, "@all", mention_all=True))["seq"]
    rs = await arrivals(gateway, key, 2)
    assert sorted(event_ids(rs)) == sorted([f"{conv}/{mention}", f"{conv}/{everyone}"])
    # a muted conversation adds only its mentions to the badge
    assert sorted(r.notification["counts"]["unread"] for r in rs) == [1, 2]
    await b.conversation_settings(conv, muted=False)
    again = (await owner.send_rest(conv, "unmuted now"))["seq"]
    rs = await arrivals(gateway, key, 3)
    assert f"{conv}/{again}" in event_ids(rs)
    assert f"{conv}/{plain}" not in event_ids(rs)
    # plain, mention, everyone and this one: all four count once unmuted
    [last] = [r for r in rs if r.notification["event_id"] == f"{conv}/{again}"]
    assert last.notification["counts"] == {"unread": 4}


async def test_notices_and_system_messages_are_never_pushed(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    owner = await user(users, pushing, "pn")
    b = await user(users, pushing, "pr")
    _, key = await phone(users, b)
    extra = await user(users, pushing, "px")
    g = await owner.create_group("notices", [b.user_id or 0])
    conv = str(g["conv_id"])
    await owner.add_members(int(g["group_id"]), [extra.user_id or 0])  # a system message
    first = (await owner.send_rest(conv, "first"))["seq"]
    await owner.edit(conv, first, "first, edited")
    await owner.react(conv, first, "👍")
    gone = (await owner.send_rest(conv, "to recall"))["seq"]
    await owner.recall(conv, gone)
    last = (await owner.send_rest(conv, "last"))["seq"]
    rs = await arrivals(gateway, key, 2)
    await eventually(lambda: f"{conv}/{last}" in event_ids(gateway.for_keys([key])))
    pushed = set(event_ids(gateway.for_keys([key])))
    # the recalled message itself may have gone out before its recall; nothing else
    assert pushed - {f"{conv}/{gone}"} == {f"{conv}/{first}", f"{conv}/{last}"}, rs
    history = (await b.history(conv, 1, last + 5))["messages"]
    notices = [
        m["seq"] for m in history if m["content_type"] in ("system", "edit", "reaction", "recall")
    ]
    assert len(notices) >= 4
    assert not pushed & {f"{conv}/{s}" for s in notices}


async def test_rejected_pushkeys_are_deleted(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    a, b, conv = await pair(users, pushing)
    p, dead = await phone(users, b, "old-phone")
    _, live = await phone(users, b, "new-phone")
    gateway.rejected.add(dead)
    before = metric(pushing.url, "im_phone_push_rejected_pushkeys_total")
    await a.send_rest(conv, "one")
    await arrivals(gateway, live, 1)
    regs = await eventually(lambda: _without(b.push_registrations(), dead), timeout=10)
    assert [(r["device_id"], r["pushkey"]) for r in regs] == [("new-phone", live)]
    assert await p.push_registrations() == regs, "the old phone's session lives on, unregistered"
    assert metric(pushing.url, "im_phone_push_rejected_pushkeys_total") >= before + 1
    await a.send_rest(conv, "two")
    await arrivals(gateway, live, 2)
    assert len(gateway.for_keys([dead])) == 1, "the deleted key gets nothing more"


async def _without(aw: Any, key: str) -> list[dict[str, Any]] | None:
    regs: list[dict[str, Any]] = await aw
    return None if any(r["pushkey"] == key for r in regs) else regs


async def test_a_read_elsewhere_sends_one_badge_only_push_with_the_final_badge(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway
) -> None:
    a, b, conv = await pair(users, pushing)
    _, key = await phone(users, b)
    seqs = [(await a.send_rest(conv, f"r{i}"))["seq"] for i in range(3)]
    await arrivals(gateway, key, 3)
    # b reads on the web (this session; no push registration), a burst of three reads
    for s in seqs:
        await b.read_rest(conv, s)
    [r] = await arrivals(gateway, key, 1, messages=False)
    assert r.notification == {
        "counts": {"unread": 0},
        "prio": "low",
        "devices": [{"app_id": APP, "pushkey": key, "data": {}}],
    }
    await asyncio.sleep(3)  # beyond the coalescing: the burst gave that one push only
    assert len(gateway.for_keys([key], lambda x: "event_id" not in x.notification)) == 1
    # a read that leaves one unread: the badge follows
    s4 = (await a.send_rest(conv, "r3"))["seq"]
    s5 = (await a.send_rest(conv, "r4"))["seq"]
    await arrivals(gateway, key, 5)
    await b.read_rest(conv, s4)
    rs = await arrivals(gateway, key, 2, messages=False)
    assert rs[-1].notification["counts"] == {"unread": 1}
    assert s5 > s4


async def test_a_pushed_message_leaves_no_outbox_row(
    users: list[Client], pushing: ServerProcess, gateway: RecordingGateway, push_stores: Stores
) -> None:
    """Once pushed, a message's outbox row is gone (the outbox does not grow), and the
    lag gauge is back to zero."""
    a, b, conv = await pair(users, pushing)
    _, key = await phone(users, b)
    seq = (await a.send_rest(conv, "row"))["seq"]
    await arrivals(gateway, key, 1)

    async def row_gone() -> bool:
        async with pg(push_stores) as db:
            n = await db.fetchval(
                "SELECT count(*) FROM push_outbox WHERE conv_id = $1 AND seq = $2", conv, seq
            )
        return n == 0

    await eventually(row_gone)
    await eventually(lambda: metric(pushing.url, "im_phone_push_lag_seconds") == 0)


async def test_without_a_gateway_no_push_rows_are_written(
    url: str, stores: Stores, users: list[Client]
) -> None:
    """The suite's own server has no gateway: its persister adds nothing to the outbox,
    and reads add no badge rows, even for users with a registration."""
    a = await new_user(url, "na")
    b = await new_user(url, "nb")
    users += [a, b]
    await befriend(a, b)
    conv = single_conv_id(a.user_id or 0, b.user_id or 0)
    await b.register_push(APP, pushkey(), "fcm")
    seq = (await a.send_rest(conv, "no gateway"))["seq"]
    await persisted(a, conv, seq)
    await b.read_rest(conv, seq)
    async with pg(stores) as db:
        rows = await db.fetchval("SELECT count(*) FROM push_outbox WHERE conv_id = $1", conv)
        badge = await db.fetchval("SELECT count(*) FROM push_badge WHERE user_id = $1", b.user_id)
    assert (rows, badge) == (0, 0)
