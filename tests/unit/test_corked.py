"""Frames of one round written together (``gateway.corked``): the frame encoding read
back by the WebSocket library's own parser, and ``Conn`` on a stand-in for uvicorn's
protocol object: one write per round in push order, the ASGI path while the transport
pushes back or before the handshake, frames before a close, nothing after the peer's
close."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.streams import StreamReader

from im_server.gateway import corked
from im_server.gateway.hub import Conn


def parse_all(data: bytes) -> list[Frame]:
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames = []
    while reader.buffer:
        gen = Frame.parse(reader.read_exact, mask=False)
        try:
            next(gen)
        except StopIteration as done:
            frames.append(done.value)
        else:  # pragma: no cover - the parser wanted more bytes than the frame holds
            raise AssertionError("incomplete frame")
    return frames


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_round_trips_through_the_parser(n: int) -> None:
    payload = ("é" * n).encode()[:n]
    (frame,) = parse_all(corked.text_frame(payload))
    assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == payload


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing


class FakeWs:
    state = State.OPEN


class Proto:
    """What ``corked`` reads of uvicorn's sans-I/O protocol, and its ASGI ``send``."""

    def __init__(self) -> None:
        self.transport = Transport()
        self.conn = FakeWs()
        self.handshake_complete = True
        self.close_sent = False
        self.disconnected = False
        self.initial_response = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.asgi: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.writable.wait()
        self.asgi.append(message)


@pytest.fixture
def proto(monkeypatch: pytest.MonkeyPatch) -> Proto:
    monkeypatch.setattr(corked, "DIRECT_PROTOCOLS", (Proto,))
    return Proto()


def texts(writes: list[bytes]) -> list[str]:
    return [f.data.decode() for w in writes for f in parse_all(w)]


async def test_frames_of_one_round_go_in_one_write_in_order(proto: Proto) -> None:
    other = Proto()
    a, b = Conn(1, "d", b"t", proto.send, 10), Conn(2, "d", b"u", other.send, 10)
    for i in range(5):
        assert a.push(f"a{i}") and b.push(f"b{i}")
    assert proto.transport.writes == [] and other.transport.writes == []  # not yet
    await asyncio.sleep(0)
    assert len(proto.transport.writes) == 1 and len(other.transport.writes) == 1
    assert texts(proto.transport.writes) == [f"a{i}" for i in range(5)]
    assert texts(other.transport.writes) == [f"b{i}" for i in range(5)]
    assert a.push("next round")
    await asyncio.sleep(0)
    assert texts(proto.transport.writes) == [*(f"a{i}" for i in range(5)), "next round"]
    assert proto.asgi == []  # the ASGI send was never needed


async def test_pushback_and_handshake_use_the_asgi_send(proto: Proto) -> None:
    c = Conn(1, "d", b"t", proto.send, 10)
    proto.handshake_complete = False
    c.push("before accept")
    proto.handshake_complete = True
    await asyncio.sleep(0)
    assert [m["text"] for m in proto.asgi] == ["before accept"]
    assert proto.transport.writes == []
    proto.writable.clear()  # the transport pushes back: the backlog takes over
    c.push("slow 1")
    c.push("slow 2")
    await asyncio.sleep(0)
    assert c.backlog is not None and proto.transport.writes == []
    proto.writable.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert [m["text"] for m in proto.asgi] == ["before accept", "slow 1", "slow 2"]
    assert c.backlog is None
    c.push("fast again")
    await asyncio.sleep(0)
    assert texts(proto.transport.writes) == ["fast again"]


async def test_close_writes_the_round_first(proto: Proto) -> None:
    c = Conn(1, "d", b"t", proto.send, 10)
    c.push("last words")
    c.close(4000, "bye")
    assert texts(proto.transport.writes) == ["last words"]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [m["type"] for m in proto.asgi] == ["websocket.close"]
    assert not c.push("after close")


async def test_nothing_is_written_once_the_peer_closed(proto: Proto) -> None:
    c = Conn(1, "d", b"t", proto.send, 10)
    c.push("lost")
    proto.conn.state = State.CLOSING  # the client's close frame came in this round
    await asyncio.sleep(0)
    assert proto.transport.writes == [] and c.closing
    assert not c.push("later")


async def test_a_failing_socket_does_not_hold_back_the_others(proto: Proto) -> None:
    bad, good = Proto(), Proto()

    def boom(data: bytes) -> None:
        raise RuntimeError("transport bug")

    bad.transport.write = boom  # type: ignore[method-assign]
    Conn(1, "d", b"t", bad.send, 10).push("x")
    Conn(2, "d", b"u", good.send, 10).push("y")
    await asyncio.sleep(0)
    assert texts(good.transport.writes) == ["y"]


async def test_a_text_fanned_out_is_framed_once_per_round(
    proto: Proto, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[bytes] = []
    real = corked.text_frame

    def counting(payload: bytes) -> bytes:
        built.append(payload)
        return real(payload)

    monkeypatch.setattr(corked, "text_frame", counting)
    members = [Proto() for _ in range(3)]
    conns = [Conn(i, "d", b"t", p.send, 10) for i, p in enumerate(members)]
    group_message = "".join(["hello ", "everyone"])  # one object, pushed to every member
    for c in conns:
        c.push(group_message)
    conns[0].push("just for the first")
    await asyncio.sleep(0)
    assert built == [b"hello everyone", b"just for the first"]
    assert texts(members[0].transport.writes) == ["hello everyone", "just for the first"]
    assert [texts(m.transport.writes) for m in members[1:]] == [["hello everyone"]] * 2
    assert corked.ROUND._frames == {}  # nothing held past the round
    conns[1].push(group_message)  # a later round frames it again
    await asyncio.sleep(0)
    assert built[-1] == b"hello everyone" and len(built) == 3


def test_an_unknown_protocol_shape_falls_back_to_the_asgi_send(proto: Proto) -> None:
    assert corked.direct_protocol(proto.send) is proto
    del proto.close_sent  # a protocol version without an attribute this module reads
    assert corked.direct_protocol(proto.send) is None
    assert corked.direct_protocol(Proto.send) is None  # not a bound method of a protocol
