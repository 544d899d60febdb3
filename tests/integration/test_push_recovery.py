"""Pushes survive what goes wrong around them (PROTOCOL.md, "Push notifications to
phones"; DESIGN.md rule 10): a gateway that is down for 10 s gets every push once it is
back while sends and acks go on, kill -9 of the process holding the pusher in the middle
of a burst loses no push (a repeat carries the same ``event_id``), and a server told to
leave content out of pushes does.

Each test runs its own server and gateway, on the module's own stores (``push_stores``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from im_server.bench.push_gateway import RecordingGateway
from im_server.client import Client
from tests.integration.test_push import APP, arrivals, event_ids, pair, phone
from tests.support import ServerProcess, Stores, eventually, metric, persisted, pg

ENV = {
    "IM_PUSH_BACKOFF_MAX_SECONDS": "2",
    "IM_PUSH_POLL_SECONDS": "0.2",
    "IM_PUSH_LEASE_SECONDS": "3",
}


@pytest.fixture
def gateway() -> Iterator[RecordingGateway]:
    gw = RecordingGateway().start()
    yield gw
    gw.stop()


@pytest.fixture
async def users() -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        await c.aclose()


def server(stores: Stores, gw: RecordingGateway, tmp_path: Path, **env: str) -> ServerProcess:
    return ServerProcess(
        env={
            **stores.env(),
            **ENV,
            "IM_PUSH_GATEWAY_URL": gw.url,
            **env,
        }
    )


async def test_a_gateway_down_for_10_s_gets_every_push_once_back_and_acks_go_on(
    push_stores: Stores, gateway: RecordingGateway, users: list[Client], tmp_path: Path
) -> None:
    stores = push_stores
    srv = server(stores, gateway, tmp_path).start()
    try:
        a, b, conv = await pair(users, srv)
        _, key = await phone(users, b)
        await a.send_rest(conv, "before")
        await arrivals(gateway, key, 1)
        gateway.stop()
        down_at = time.monotonic()
        seqs = [(await a.send_rest(conv, f"while down {i}"))["seq"] for i in range(5)]
        await persisted(a, conv, seqs[-1])
        assert time.monotonic() - down_at < 10, "acked and stored while the gateway is down"
        retries = 'im_phone_pushes_total{kind="message",result="retry"}'
        await eventually(lambda: metric(srv.url, retries) > 0)
        await asyncio.sleep(max(0.0, 10 - (time.monotonic() - down_at)))
        gateway.start()
        rs = await arrivals(gateway, key, 6, timeout=20)
        assert {f"{conv}/{s}" for s in seqs} <= set(event_ids(rs))
        assert metric(srv.url, "im_phone_push_backoff_seconds") == 0
    finally:
        srv.terminate()


async def test_kill9_mid_burst_loses_no_push_and_pushes_no_notice(
    push_stores: Stores, gateway: RecordingGateway, users: list[Client], tmp_path: Path
) -> None:
    stores = push_stores
    gateway.delay = 0.15  # a slow gateway: the burst is still being pushed at the kill
    slow = {"IM_PUSH_CONCURRENCY": "2"}
    srv = server(stores, gateway, tmp_path, **slow).start()
    srv2: ServerProcess | None = None
    try:
        a, b, conv = await pair(users, srv)
        _, key = await phone(users, b)
        sent: list[int] = []
        notices: list[int] = []
        for i in range(24):
            seq = (await a.send_rest(conv, f"burst {i}"))["seq"]
            sent.append(seq)
            if i % 6 == 0:  # an edit and a reaction: notices, never pushed
                notices.append((await a.edit(conv, seq, f"burst {i}, edited"))["edit_seq"])
                await a.react(conv, seq, "👍")
        await arrivals(gateway, key, 3)
        srv.kill9()
        at_kill = len(gateway.for_keys([key]))
        assert at_kill < len(sent), "killed mid-burst"
        srv2 = server(stores, gateway, tmp_path, **slow).start()
        want = {f"{conv}/{s}" for s in sent}

        def all_there() -> bool:
            return want <= set(event_ids(gateway.for_keys([key])))

        await eventually(all_there, timeout=60)
        await asyncio.sleep(1)
        pushed = event_ids(gateway.for_keys([key]))
        assert set(pushed) == want, "every message at least once, nothing else"
        async with pg(stores) as db:
            rows = await db.fetch(
                "SELECT seq FROM messages WHERE conv_id = $1 AND content_type <> 'text'", conv
            )
        notice_ids = {f"{conv}/{r['seq']}" for r in rows}
        assert len(notice_ids) >= 8 and not notice_ids & set(pushed)
        assert {f"{conv}/{s}" for s in notices} <= notice_ids
        for r in gateway.for_keys([key]):
            assert r.notification["devices"] == [{"app_id": APP, "pushkey": key, "data": {}}]
    finally:
        srv.kill9()
        if srv2 is not None:
            srv2.terminate()


async def test_content_is_left_out_when_configured(
    push_stores: Stores, gateway: RecordingGateway, users: list[Client], tmp_path: Path
) -> None:
    stores = push_stores
    srv = server(stores, gateway, tmp_path, IM_PUSH_INCLUDE_CONTENT="false").start()
    try:
        a, b, conv = await pair(users, srv)
        _, key = await phone(users, b)
        seq = (await a.send_rest(conv, "a secret"))["seq"]
        [r] = await arrivals(gateway, key, 1)
        assert r.notification == {
            "event_id": f"{conv}/{seq}",
            "room_id": conv,
            "type": "message",
            "sender": str(a.user_id),
            "counts": {"unread": 1},
            "prio": "high",
            "devices": [{"app_id": APP, "pushkey": key, "data": {}}],
        }
    finally:
        srv.terminate()


async def test_rows_only_where_someone_could_get_a_push(
    push_stores: Stores, gateway: RecordingGateway, users: list[Client], tmp_path: Path
) -> None:
    """With the pusher stopped the rows stay to be seen: a message in a conversation
    where a member holds a registration has its row, one where nobody does has none
    (nobody could get a push; the pusher's work per row is what push costs sends), and
    a notice has none."""
    srv = server(push_stores, gateway, tmp_path, IM_RUN_PUSHER="false").start()
    try:
        a, b, with_reg = await pair(users, srv)
        await phone(users, b)
        c, d, without = await pair(users, srv)
        s1 = (await a.send_rest(with_reg, "to a phone"))["seq"]
        edit = (await a.edit(with_reg, s1, "edited"))["edit_seq"]
        s2 = (await c.send_rest(without, "to nobody's phone"))["seq"]
        await persisted(a, with_reg, edit)
        await persisted(c, without, s2)
        async with pg(push_stores) as db:
            rows = await db.fetch(
                "SELECT conv_id, seq FROM push_outbox WHERE conv_id = ANY($1::text[])",
                [with_reg, without],
            )
        assert [(r["conv_id"], r["seq"]) for r in rows] == [(with_reg, s1)]
    finally:
        srv.terminate()
