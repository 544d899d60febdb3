"""``im-server serve --workers N``: worker processes sharing one port (SO_REUSEPORT).
Users whose sockets land on different workers talk both ways (the cross-process fan-out),
a worker killed with -9 is restarted by the parent and no acked message is lost, SIGTERM
on the parent leaves no process behind, and ``--workers 1`` serves in the process
started. Real processes, real stores."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import psutil
import pytest

from im_server.client import Client, Connection
from im_server.client.errors import ConnectionLost
from im_server.config import load_settings
from im_server.runtime.serve_workers import check_port_free, listening_socket
from tests.support import ServerProcess, Stores, befriend, eventually, new_user, pg

pytestmark = pytest.mark.timeout(180)


def worker_pids(srv: ServerProcess) -> set[int]:
    """The worker processes the serve parent runs now (zombies left out)."""
    assert srv.proc is not None
    out = set()
    for p in psutil.Process(srv.proc.pid).children():
        try:
            if "--worker-index" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def holder(pids: set[int], srv: ServerProcess, conn: Connection) -> int | None:
    """The process (of ``pids``) holding the server end of ``conn``'s TCP connection."""
    local_port = conn.ws.local_address[1]
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections("tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.laddr and c.laddr.port == srv.port and c.raddr and c.raddr.port == local_port:
                return pid
    return None


async def connect_on(client: Client, srv: ServerProcess, pid: int, tries: int = 60) -> Connection:
    """A connection of ``client`` that the worker ``pid`` accepted (the kernel picks the
    worker of each new connection: open until one lands there, close the others)."""
    for _ in range(tries):
        conn = await client.connect()
        if holder({pid}, srv, conn) == pid:
            return conn
        await conn.close()
    raise AssertionError(f"no connection of {tries} landed on worker {pid}")


def cmid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex}"


async def linked(a: Client, ca: Connection, b: Client, cb: Connection, conv: str) -> None:
    """Wait until a push crosses from each worker to the other (a worker publishes to the
    others once it learnt they are live, within its first heartbeat)."""

    async def crosses(sender: Client, to: Connection) -> bool:
        m = cmid("probe")
        await sender.send_rest(conv, "probe", client_msg_id=m)
        ev = await to.try_next_event("message", 0.5, lambda f: f["message"]["client_msg_id"] == m)
        return ev is not None

    await eventually(lambda: crosses(a, cb), timeout=20, interval=0)
    await eventually(lambda: crosses(b, ca), timeout=20, interval=0)


async def receive_all(conn: Connection, want: set[str]) -> list[str]:
    """The client_msg_ids of the counted messages received until all of ``want`` came,
    then whatever else comes within half a second (a duplicate would)."""
    got: list[str] = []

    def counted(f: dict[str, Any]) -> bool:
        return str(f["message"]["client_msg_id"]).startswith("x-")

    while not want <= set(got):
        ev = await conn.next_event("message", timeout=10, predicate=counted)
        got.append(ev["message"]["client_msg_id"])
    while (ev := await conn.try_next_event("message", 0.5, counted)) is not None:
        got.append(ev["message"]["client_msg_id"])
    return got


async def stored(stores: Stores, conv: str) -> list[tuple[str, int]]:
    async with pg(stores) as c:
        rows = await c.fetch(
            "SELECT client_msg_id, seq FROM messages WHERE conv_id = $1 AND client_msg_id LIKE 'x-%'",
            conv,
        )
    return [(r["client_msg_id"], r["seq"]) for r in rows]


def test_workers_setting_defaults_to_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IM_WORKERS", raising=False)
    assert load_settings().workers == len(os.sched_getaffinity(0))
    monkeypatch.setenv("IM_WORKERS", "3")
    assert load_settings().workers == 3


async def test_two_workers_deliver_both_ways_and_sigterm_stops_all(stores: Stores) -> None:
    srv = ServerProcess(env={**stores.env(), "IM_NODE_NAME": "wk2"}, workers=2).start()
    pids: set[int] = set()
    try:
        await eventually(lambda: len(worker_pids(srv)) == 2, timeout=30)
        pids = worker_pids(srv)
        first, second = sorted(pids)
        a, b = await new_user(srv.url, "wa"), await new_user(srv.url, "wb")
        conv = await befriend(a, b)
        ca = await connect_on(a, srv, first)
        cb = await connect_on(b, srv, second)
        assert holder(pids, srv, ca) != holder(pids, srv, cb)
        await linked(a, ca, b, cb, conv)

        n = 25
        a_ids = [cmid("x-a") for _ in range(n)]
        b_ids = [cmid("x-b") for _ in range(n)]
        acks = await asyncio.gather(
            *(ca.send(conv, f"a{i}", client_msg_id=m) for i, m in enumerate(a_ids)),
            *(cb.send(conv, f"b{i}", client_msg_id=m) for i, m in enumerate(b_ids)),
        )
        assert all(x["ok"] and not x["duplicate"] for x in acks), acks
        at_b, at_a = await asyncio.gather(receive_all(cb, set(a_ids)), receive_all(ca, set(b_ids)))
        assert sorted(at_b) == sorted(a_ids), "each of a's messages once at b"
        assert sorted(at_a) == sorted(b_ids), "each of b's messages once at a"
        seqs = sorted(int(x["seq"]) for x in acks)
        assert len(set(seqs)) == 2 * n  # one seq each, across both workers

        async def all_stored() -> bool:
            return len(await stored(stores, conv)) == 2 * n

        await eventually(all_stored, timeout=20)
        assert sorted(s for _, s in await stored(stores, conv)) == seqs
        await ca.close()
        await cb.close()
        await a.aclose()
        await b.aclose()
    finally:
        rc = srv.terminate(timeout=40)
    assert rc == 0, srv.log_tail()
    assert pids and not any(psutil.pid_exists(p) for p in pids), "a worker outlived its parent"
    assert "with 2 worker processes" in srv.log_tail(200)


async def test_a_killed_worker_is_restarted_and_no_acked_message_lost(stores: Stores) -> None:
    srv = ServerProcess(env={**stores.env(), "IM_NODE_NAME": "wk9"}, workers=2).start()
    try:
        await eventually(lambda: len(worker_pids(srv)) == 2, timeout=30)
        pids = worker_pids(srv)
        a, b = await new_user(srv.url, "ka"), await new_user(srv.url, "kb")
        conv = await befriend(a, b)
        victim = min(pids)  # the first started: worker 0, the one running the persister
        ca = await connect_on(a, srv, victim)
        cb = await connect_on(b, srv, max(pids))
        await linked(a, ca, b, cb, conv)

        acked: dict[str, int] = {}
        for i in range(20):
            m = cmid("x-k")
            ack = await ca.send(conv, f"before {i}", client_msg_id=m)
            assert ack["ok"], ack
            acked[m] = int(ack["seq"])
        # delivered first: a push not yet published when its worker dies is for sync
        assert set(await receive_all(cb, set(acked))) == set(acked)
        os.kill(victim, 9)
        with pytest.raises(ConnectionLost):
            await ca.next_event("never", timeout=10)

        # the parent starts a new worker 0; the other one kept serving meanwhile
        await eventually(lambda: len(worker_pids(srv) - pids) == 1, timeout=30)
        assert srv.proc is not None and srv.proc.poll() is None
        assert max(pids) in worker_pids(srv)
        assert "restarting it in" in srv.log_tail(200)

        ca = await a.connect()  # the client reconnects, to whichever worker
        await linked(a, ca, b, cb, conv)
        after: set[str] = set()
        for i in range(10):
            m = cmid("x-k")
            ack = await ca.send(conv, f"after {i}", client_msg_id=m)
            assert ack["ok"], ack
            acked[m] = int(ack["seq"])
            after.add(m)
        assert sorted(await receive_all(cb, after)) == sorted(after)

        async def all_stored() -> bool:
            return len(await stored(stores, conv)) >= len(acked)

        await eventually(all_stored, timeout=30)
        assert sorted(await stored(stores, conv)) == sorted(acked.items()), "lost or doubled"
        await ca.close()
        await cb.close()
        await a.aclose()
        await b.aclose()
    finally:
        srv.terminate(timeout=40)


async def test_one_worker_serves_in_the_process_started(stores: Stores) -> None:
    srv = ServerProcess(env={**stores.env(), "IM_NODE_NAME": "wk1"}, workers=1).start()
    try:
        assert srv.proc is not None
        assert worker_pids(srv) == set()
        a = await new_user(srv.url, "one")
        conn = await a.connect()
        assert holder({srv.proc.pid}, srv, conn) == srv.proc.pid
        await conn.close()
        await a.aclose()
        assert "worker processes" not in srv.log_tail(200)
    finally:
        srv.terminate()


def test_a_port_shared_by_workers_is_refused_to_a_second_serve() -> None:
    """Workers bind with SO_REUSEPORT; the parent's probe binds without, so a second
    ``serve --workers N`` on a port in use fails instead of joining the first."""
    a = listening_socket("127.0.0.1", 0)
    port = a.getsockname()[1]
    b = listening_socket("127.0.0.1", port)  # a second worker of the same server
    try:
        a.listen()
        b.listen()
        with pytest.raises(OSError):
            check_port_free("127.0.0.1", port)
    finally:
        a.close()
        b.close()
    check_port_free("127.0.0.1", port)  # free again
