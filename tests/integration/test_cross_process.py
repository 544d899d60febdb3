"""Two server processes on the same stores: a send on one reaches devices on the other
(fan-out through Redis pub/sub: each process's inbox, routed by the user registry), and
the sending device gets only its ack."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from im_server.client import Client, Connection
from im_server.storage.redis import keys
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    linked_servers,
    new_user,
    rds,
)

PUSH_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def two_servers(
    stores: Stores, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    logs = tmp_path_factory.mktemp("xlogs")
    env = {**stores.env(), "IM_TEST_LOG_DIR": str(logs)}
    with linked_servers(env, "xnode-1", "xnode-2") as pair:
        yield pair


async def login_on(url: str, client: Client, device_id: str) -> Client:
    return await Client.login(url, str(client.username), PASSWORD, device_id=device_id)


async def settle(*conns: Connection) -> None:
    """A ping round trip on each socket (the server registers a socket and lists itself
    in its user's registry entry before completing the handshake, so this is belt and braces;
    the nodes already publish to each other, see ``two_servers``)."""
    for c in conns:
        await c.ping()


def is_msg(client_msg_id: str) -> Any:
    return lambda f: f.get("message", {}).get("client_msg_id") == client_msg_id


async def expect_push(
    conn: Connection, client_msg_id: str, who: str, servers: tuple[ServerProcess, ...]
) -> dict[str, Any]:
    try:
        ev = await conn.next_event("message", PUSH_TIMEOUT, is_msg(client_msg_id))
    except TimeoutError:
        tails = "\n---\n".join(s.log_tail(30) for s in servers)
        raise AssertionError(f"{who} got no push of {client_msg_id}\n{tails}") from None
    return ev["message"]


async def test_push_crosses_processes(two_servers: tuple[ServerProcess, ServerProcess]) -> None:
    s1, s2 = two_servers
    a = await new_user(s1.url, "xa")
    b = await new_user(s2.url, "xb")
    a2 = await login_on(s2.url, a, "a-second-device")
    clients = [a, b, a2]
    try:
        conv = await befriend(a, b)
        ca = await a.connect()  # server 1
        cb = await b.connect()  # server 2
        ca2 = await a2.connect()  # server 2, A's other device
        await settle(ca, cb, ca2)

        m = f"x-{uuid.uuid4().hex}"
        ack = await ca.send(conv, "across", client_msg_id=m)
        assert ack["ok"] is True and ack["duplicate"] is False, ack
        got_b = await expect_push(cb, m, "B on server 2", two_servers)
        got_a2 = await expect_push(ca2, m, "A's second device on server 2", two_servers)
        for got in (got_b, got_a2):
            assert got["seq"] == ack["seq"] and got["conv_id"] == conv
            assert got["sender_id"] == a.user_id and got["content"] == {"text": "across"}
        echo = await ca.try_next_event("message", 1.0, is_msg(m))
        assert echo is None, f"the sending device got its own message back: {echo}"

        # the other way round: B on server 2 -> A's devices on both servers
        m2 = f"y-{uuid.uuid4().hex}"
        ack2 = await cb.send(conv, "back", client_msg_id=m2)
        assert ack2["ok"] is True and ack2["seq"] > ack["seq"], ack2
        for conn, who in ((ca, "A on server 1"), (ca2, "A's device on server 2")):
            got = await expect_push(conn, m2, who, two_servers)
            assert got["seq"] == ack2["seq"]
        assert await cb.try_next_event("message", 0.5, is_msg(m2)) is None
    finally:
        for c in clients:
            await c.aclose()


async def test_group_push_across_processes(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    s1, s2 = two_servers
    a = await new_user(s1.url, "ga")
    b = await new_user(s2.url, "gb")
    c = await new_user(s1.url, "gc")
    c2 = await login_on(s2.url, c, "c-second-device")
    clients = [a, b, c, c2]
    try:
        g = await a.create_group("cross", [int(b.user_id or 0), int(c.user_id or 0)])
        conv = g["conv_id"]
        conns = {
            "A@1": await a.connect(),
            "B@2": await b.connect(),
            "C@1": await c.connect(),
            "C'@2": await c2.connect(),
        }
        await settle(*conns.values())
        for sender in ("A@1", "B@2", "C'@2"):
            m = f"g-{uuid.uuid4().hex}"
            ack = await conns[sender].send(conv, f"from {sender}", client_msg_id=m)
            assert ack["ok"] is True, (sender, ack)
            for who, conn in conns.items():
                if who == sender:
                    continue
                got = await expect_push(conn, m, f"{who} (sent by {sender})", two_servers)
                assert got["seq"] == ack["seq"] and got["conv_id"] == conv
            echo = await conns[sender].try_next_event("message", 0.7, is_msg(m))
            assert echo is None, f"{sender} got its own message back: {echo}"
    finally:
        for cl in clients:
            await cl.aclose()


async def test_cursor_pushes_and_receipts_cross_processes(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """read and delivered pushes, and group receipts, reach devices on the other process."""
    s1, s2 = two_servers
    a = await new_user(s1.url, "xra")
    b = await new_user(s2.url, "xrb")
    c = await new_user(s2.url, "xrc")
    a_on_2 = await login_on(s2.url, a, "a-on-2")
    try:
        conv = await befriend(a, b)
        ca, cb, ca2 = await a.connect(), await b.connect(), await a_on_2.connect()
        await settle(ca, cb, ca2)
        ack = await ca.send(conv, "did you get it?")
        await cb.delivered(conv, ack["seq"])
        ev = await ca.next_event("delivered", PUSH_TIMEOUT)
        assert ev == {"type": "delivered", "conv_id": conv, "user_id": b.user_id, "seq": ack["seq"]}
        await cb.read(conv, ack["seq"])
        ev = await ca.next_event("read", PUSH_TIMEOUT)
        assert ev["user_id"] == b.user_id and ev["seq"] == ack["seq"]
        # my read on server 2 reaches my device on server 1
        back = await cb.send(conv, "yes")
        await ca2.read(conv, back["seq"])
        ev = await ca.next_event("read", PUSH_TIMEOUT, lambda f: f["user_id"] == a.user_id)
        assert ev["seq"] == back["seq"]

        g = await a.create_group("x-receipts", [b.user_id, c.user_id])
        cc = await c.connect()
        await settle(cc)
        gack = await ca.send(g["conv_id"], "group hello")
        await b.read_rest(g["conv_id"], gack["seq"])
        await c.read_rest(g["conv_id"], gack["seq"])
        deadline = asyncio.get_running_loop().time() + 6
        best = 0
        while best < 2 and asyncio.get_running_loop().time() < deadline:
            ev = await ca.next_event("receipt", 6, lambda f: f["conv_id"] == g["conv_id"])
            best = max(best, ev["read_count"])
        assert best == 2, "the sender on server 1 hears of reads made through server 2"
        for conn in (ca, cb, ca2, cc):
            await conn.close()
    finally:
        for cl in (a, b, c, a_on_2):
            await cl.aclose()


async def registered(stores: Stores, user_id: int) -> list[str]:
    """The processes the registry lists for the user now."""
    async with rds(stores) as r:
        return list(
            await r.zrangebyscore(keys.user_nodes(user_id), int(time.time() * 1000), "+inf")
        )


async def test_one_inbox_message_per_process_for_a_group(
    two_servers: tuple[ServerProcess, ServerProcess], stores: Stores
) -> None:
    """A send to a group of twelve whose members are all on the other process is one
    message on that process's inbox, naming the twelve (not one message per user); the
    registry lists each member's process from the handshake on, and drops it when the
    member's last socket there closes."""
    s1, s2 = two_servers
    a = await new_user(s1.url, "ia")
    members = [await new_user(s2.url, "im") for _ in range(12)]
    ids = sorted(int(m.user_id or 0) for m in members)
    try:
        g = await a.create_group("inbox", ids)
        ca = await a.connect()
        conns = [await m.connect() for m in members]
        for uid in ids:
            assert await registered(stores, uid) == ["xnode-2"], uid
        assert await registered(stores, int(a.user_id or 0)) == ["xnode-1"]
        async with rds(stores) as r:
            ps = r.pubsub(ignore_subscribe_messages=True)
            await ps.subscribe(keys.inbox("xnode-2"))
            m = f"i-{uuid.uuid4().hex}"
            ack = await ca.send(g["conv_id"], "to all of you", client_msg_id=m)
            assert ack["ok"] is True, ack
            for conn in conns:
                await expect_push(conn, m, "a member on server 2", two_servers)
            carried: list[str] = []
            quiet_until = time.monotonic() + 1.0  # (a None may be a skipped confirmation)
            while time.monotonic() < quiet_until:
                msg = await ps.get_message(timeout=0.2)
                if msg is not None and m in msg["data"]:
                    carried.append(msg["data"])
            await ps.aclose()
        assert len(carried) == 1, carried
        origin, users, frame = carried[0].split("\n", 2)
        assert origin == "xnode-1" and sorted(int(u) for u in users.split(",")) == ids
        assert f'"client_msg_id":"{m}"' in frame

        await conns[0].close()
        await eventually(lambda: _empty(stores, int(members[0].user_id or 0)), timeout=5)
        await ca.close()
        for conn in conns[1:]:
            await conn.close()
    finally:
        await a.aclose()
        for mc in members:
            await mc.aclose()


async def _empty(stores: Stores, user_id: int) -> bool:
    return await registered(stores, user_id) == []
