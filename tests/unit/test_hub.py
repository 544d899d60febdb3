"""The local connection hub without sockets: ``Conn`` drives fake ASGI ``send`` callables.

``Socket.send`` completes without suspending while the socket is writable and waits on an
``asyncio.Event`` while it is not (the transport pushing back), which are the two paths of
``Conn.push``: a frame goes at once, or waits in the bounded backlog drained by a task.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from prometheus_client import REGISTRY

from im_server.gateway.hub import CLOSE_SLOW, Conn, Hub
from tests.support import eventually

Message = dict[str, Any]


class Socket:
    """A fake ASGI ``send``: records each message when its send completes. While
    ``writable`` is clear every send waits for it, as a socket whose buffer is full."""

    def __init__(self, *, writable: bool = True) -> None:
        self.sent: list[Message] = []
        self.calls = 0
        self.writable = asyncio.Event()
        if writable:
            self.writable.set()
        self.broken: Exception | None = None

    async def send(self, message: Message) -> None:
        self.calls += 1
        await self.writable.wait()
        if self.broken is not None:
            raise self.broken
        self.sent.append(message)

    def texts(self) -> list[str]:
        return [m["text"] for m in self.sent if m["type"] == "websocket.send"]

    def closes(self) -> list[Message]:
        return [m for m in self.sent if m["type"] == "websocket.close"]


class Yielding(Socket):
    """Every send yields to the loop once (a bare ``sleep(0)``, no future to wait on)."""

    async def send(self, message: Message) -> None:
        self.calls += 1
        await asyncio.sleep(0)  # the behaviour under test: a send that suspends bare
        self.sent.append(message)


class Recorder:
    """The plainest ASGI send: an async function that never suspends."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def gone(message: Message) -> None:
    raise ConnectionResetError("the client is gone")


def conn(send: Any, user_id: int = 1, max_backlog: int = 100, token: bytes = b"t") -> Conn:
    return Conn(user_id, f"dev{user_id}", token, send, max_backlog)


def sample(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return 0.0 if value is None else value


async def drained(c: Conn) -> None:
    """Wait until the connection's drainer is done (backlog gone)."""
    await eventually(lambda: c.backlog is None, timeout=2.0, interval=0.001)


# -- Conn.push -----------------------------------------------------------------------------


async def test_push_sends_at_once_while_writable() -> None:
    sock = Socket()
    c = conn(sock.send)
    assert c.push("a") is True
    # no await in between: the frame went out inside push()
    assert sock.texts() == ["a"]
    assert c.backlog is None
    assert c.push("b") is True and c.push("c") is True
    assert sock.texts() == ["a", "b", "c"]
    assert sock.sent[0] == {"type": "websocket.send", "text": "a"}


async def test_push_with_a_plain_recorder() -> None:
    rec = Recorder()
    c = conn(rec.send)
    for i in range(5):
        assert c.push(str(i))
    assert [m["text"] for m in rec.sent] == ["0", "1", "2", "3", "4"]
    assert c.backlog is None and not c.closing


async def test_backpressure_queues_then_drains_in_order() -> None:
    sock = Socket(writable=False)
    c = conn(sock.send)
    assert c.push("a") is True  # in flight, suspended
    assert c.push("b") is True
    assert c.push("c") is True
    assert sock.sent == []
    assert c.backlog is not None and list(c.backlog) == ["b", "c"]
    assert sock.calls == 1  # queued frames do not start a send
    drainer = c._drainer
    assert drainer is not None
    await asyncio.sleep(0)  # the drainer's first step runs while the socket is still paused
    assert not drainer.done() and not c.closing and sock.sent == []

    sock.writable.set()
    await drained(c)
    assert sock.texts() == ["a", "b", "c"]
    assert not c.closing
    # writable again: the next frame goes at once, without a task
    assert c.push("d") is True
    assert sock.texts() == ["a", "b", "c", "d"]
    assert c.backlog is None


async def test_pushes_while_draining_keep_their_order() -> None:
    """Frames pushed while the drainer works join the same backlog, behind the rest."""
    sock = Socket(writable=False)
    c = conn(sock.send)
    for i in range(3):
        c.push(str(i))
    sock.writable.set()
    await eventually(lambda: len(sock.sent) >= 1, timeout=2.0, interval=0.001)
    sock.writable.clear()  # pushes back again in the middle of the drain
    for i in range(3, 6):
        assert c.push(str(i))
    sock.writable.set()
    await drained(c)
    assert sock.texts() == [str(i) for i in range(6)]


async def test_a_send_that_yields_bare_is_finished_by_the_drainer() -> None:
    sock = Yielding()
    c = conn(sock.send)
    assert c.push("a") is True
    assert c.push("b") is True
    assert sock.sent == []
    await drained(c)
    assert sock.texts() == ["a", "b"]


@pytest.mark.parametrize("seed", range(5))
async def test_order_under_intermittent_backpressure(seed: int) -> None:
    """The socket stalls and recovers at random moments: every frame arrives, once, in
    order, as long as the backlog stays below its bound."""
    rnd = random.Random(seed)
    sock = Socket()
    n = 400
    c = conn(sock.send, max_backlog=n)
    frames = [f"f{i}" for i in range(n)]
    for f in frames:
        assert c.push(f) is True
        r = rnd.random()
        if r < 0.1:
            sock.writable.clear()
        elif r < 0.3:
            sock.writable.set()
        if rnd.random() < 0.3:
            await asyncio.sleep(0)  # let the drainer run a step: the interleaving under test
    sock.writable.set()
    await drained(c)
    assert sock.texts() == frames
    assert not c.closing


async def test_backlog_up_to_the_bound_loses_nothing() -> None:
    sock = Socket(writable=False)
    c = conn(sock.send, max_backlog=3)
    dropped = sample("im_dropped_slow_consumers_total")
    assert all(c.push(f) for f in ["a", "b", "c", "d"])  # one in flight + three queued
    assert not c.closing
    sock.writable.set()
    await drained(c)
    assert sock.texts() == ["a", "b", "c", "d"]
    assert sample("im_dropped_slow_consumers_total") == dropped


async def test_slow_client_past_the_bound_is_dropped() -> None:
    sock = Socket(writable=False)
    c = conn(sock.send, max_backlog=3)
    dropped = sample("im_dropped_slow_consumers_total")
    for f in ["a", "b", "c", "d"]:
        assert c.push(f) is True
    assert c.push("e") is False
    assert c.closing
    assert sample("im_dropped_slow_consumers_total") == dropped + 1
    # once closing, pushes are refused and not counted again
    assert c.push("f") is False
    assert sample("im_dropped_slow_consumers_total") == dropped + 1

    drainer = c._drainer
    assert drainer is not None
    await eventually(drainer.done, timeout=2.0, interval=0.001)
    sock.writable.set()
    await eventually(lambda: sock.closes(), timeout=2.0, interval=0.001)
    assert sock.closes() == [
        {"type": "websocket.close", "code": CLOSE_SLOW, "reason": "too slow: send queue full"}
    ]
    assert sock.sent[-1]["type"] == "websocket.close"
    # the drainer was cancelled: the queued frames never go, the one in flight at most once
    assert sock.texts() in ([], ["a"])


async def test_send_that_raises_at_once_marks_the_connection_closing() -> None:
    calls: list[Message] = []

    async def broken(message: Message) -> None:
        calls.append(message)
        raise ConnectionResetError("reset by peer")

    c = conn(broken)
    assert c.push("a") is False
    assert c.closing
    assert c.push("b") is False
    assert len(calls) == 1  # nothing is tried after the failure
    assert c.backlog is None


async def test_send_that_raises_after_suspending_stops_the_drain() -> None:
    sock = Socket(writable=False)
    c = conn(sock.send)
    assert c.push("a") and c.push("b") and c.push("c")
    sock.broken = ConnectionResetError("reset by peer")
    sock.writable.set()
    await drained(c)
    assert c.closing
    assert sock.sent == []
    assert sock.calls == 1  # the queued frames were not tried on a dead socket
    assert c.push("d") is False


async def test_close_sends_one_close_message() -> None:
    rec = Recorder()
    c = conn(rec.send)
    c.push("hello")
    c.close(4001, "revoked")
    c.close(1000, "again")  # a second close is a no-op
    assert c.closing
    await eventually(lambda: len(rec.sent) >= 2, timeout=2.0, interval=0.001)
    assert rec.sent == [
        {"type": "websocket.send", "text": "hello"},
        {"type": "websocket.close", "code": 4001, "reason": "revoked"},
    ]
    assert c.push("late") is False
    assert len(rec.sent) == 2


async def test_close_cancels_the_drainer() -> None:
    sock = Socket(writable=False)
    c = conn(sock.send)
    c.push("a")
    c.push("b")
    drainer = c._drainer
    assert drainer is not None and not drainer.done()
    c.close(1012, "server restarting")
    await eventually(drainer.done, timeout=2.0, interval=0.001)
    assert drainer.cancelled()
    sock.writable.set()
    await eventually(lambda: sock.closes(), timeout=2.0, interval=0.001)
    assert sock.closes() == [
        {"type": "websocket.close", "code": 1012, "reason": "server restarting"}
    ]
    assert "b" not in sock.texts()


async def test_close_on_a_dead_socket_does_not_raise() -> None:
    calls: list[Message] = []

    async def broken(message: Message) -> None:
        calls.append(message)
        raise ConnectionResetError("gone")

    c = conn(broken)
    c.close(1000)
    await eventually(lambda: calls, timeout=2.0, interval=0.001)
    assert calls == [{"type": "websocket.close", "code": 1000, "reason": ""}]
    assert c.push("x") is False


async def test_connection_ids_are_unique() -> None:
    rec = Recorder()
    ids = [conn(rec.send).id for _ in range(50)]
    assert len(set(ids)) == 50
    assert ids == sorted(ids)


# -- Hub -----------------------------------------------------------------------------------


async def test_add_and_remove_report_first_and_last_connection() -> None:
    hub = Hub()
    rec = Recorder()
    a1, a2, b1 = conn(rec.send, 1), conn(rec.send, 1), conn(rec.send, 2)
    assert hub.add(a1) is True
    assert hub.add(a2) is False
    assert hub.add(b1) is True
    assert hub.count == 3
    assert sample("im_connections") == 3
    assert hub.user_connections(1) == 2 and hub.user_connections(2) == 1
    assert hub.user_connections(3) == 0
    assert set(hub.all()) == {a1, a2, b1}

    assert hub.remove(a1) is False  # user 1 still has a2
    assert hub.remove(a1) is False  # already gone: no change
    assert hub.count == 2
    assert hub.remove(a2) is True
    assert hub.user_connections(1) == 0 and 1 not in hub.by_user
    assert hub.remove(conn(rec.send, 2)) is False  # never added
    assert hub.remove(conn(rec.send, 9)) is False  # unknown user
    assert hub.count == 1
    assert sample("im_connections") == 1
    assert hub.remove(b1) is True
    assert hub.count == 0 and hub.by_user == {} and hub.all() == []


async def test_devices_of_a_user_here() -> None:
    """What the presence tracker records per user: its devices with a socket here, and
    the count per device that decides when a device's first or last socket changed."""
    hub = Hub()
    rec = Recorder()
    phone1, phone2 = Conn(1, "phone", b"t", rec.send, 9), Conn(1, "phone", b"t", rec.send, 9)
    laptop, other = Conn(1, "laptop", b"u", rec.send, 9), Conn(2, "phone", b"v", rec.send, 9)
    for c in (phone1, phone2, laptop, other):
        hub.add(c)
    assert hub.user_devices(1) == {"phone", "laptop"} and hub.user_devices(2) == {"phone"}
    assert hub.device_connections(1, "phone") == 2 and hub.device_connections(1, "laptop") == 1
    hub.remove(phone1)
    assert hub.device_connections(1, "phone") == 1 and hub.user_devices(1) == {"phone", "laptop"}
    hub.remove(phone2)
    assert hub.device_connections(1, "phone") == 0 and hub.user_devices(1) == {"laptop"}
    hub.remove(laptop)
    assert hub.user_devices(1) == set() and hub.device_connections(1, "laptop") == 0
    assert hub.user_devices(3) == set() and hub.device_connections(3, "x") == 0


async def test_deliver_reaches_every_device_and_counts() -> None:
    hub = Hub()
    s1, s2, s3 = Recorder(), Recorder(), Recorder()
    a1, a2, b = conn(s1.send, 1), conn(s2.send, 1), conn(s3.send, 2)
    for c in (a1, a2, b):
        hub.add(c)
    pushes = sample("im_pushes_total")
    assert hub.deliver([1, 2, 3], "x") == 3  # user 3 has no connection here
    assert [m["text"] for m in s1.sent + s2.sent + s3.sent] == ["x", "x", "x"]
    assert sample("im_pushes_total") == pushes + 3

    assert hub.deliver((1,), "y", exclude_conn=a1.id) == 1
    assert [m["text"] for m in s1.sent] == ["x"]
    assert [m["text"] for m in s2.sent] == ["x", "y"]
    assert hub.deliver([], "z") == 0
    assert hub.deliver([7], "z") == 0
    assert sample("im_pushes_total") == pushes + 4


async def test_deliver_skips_closing_connections() -> None:
    hub = Hub()
    ok, dead = Recorder(), Recorder()
    c_ok, c_dead = conn(ok.send, 1), conn(dead.send, 1)
    hub.add(c_ok)
    hub.add(c_dead)
    c_dead.close(1000)
    await eventually(lambda: dead.sent, timeout=2.0, interval=0.001)
    assert hub.deliver([1], "x") == 1
    assert [m["text"] for m in ok.sent] == ["x"]
    assert [m["type"] for m in dead.sent] == ["websocket.close"]


async def test_close_where_closes_the_matching_connections() -> None:
    hub = Hub()
    socks = {name: Recorder() for name in ("a1", "a2", "b1")}
    a1 = conn(socks["a1"].send, 1, token=b"old")
    a2 = conn(socks["a2"].send, 1, token=b"new")
    b1 = conn(socks["b1"].send, 2, token=b"old")
    for c in (a1, a2, b1):
        hub.add(c)
    n = hub.close_where(lambda c: c.token_hash == b"old", 4001, "session revoked")
    assert n == 2
    await eventually(lambda: socks["a1"].sent and socks["b1"].sent, timeout=2.0, interval=0.001)
    close = {"type": "websocket.close", "code": 4001, "reason": "session revoked"}
    assert socks["a1"].sent == [close] and socks["b1"].sent == [close]
    assert socks["a2"].sent == []
    assert a1.closing and b1.closing and not a2.closing
    assert hub.close_where(lambda c: False, 1000, "") == 0
    assert hub.deliver([1, 2], "x") == 1  # only a2 still takes frames
