"""A reader that stalls: the server's socket pushes back, frames wait in the connection's
bounded backlog, and once the reader reads again every push arrives, in order."""

from __future__ import annotations

import asyncio
import socket

import orjson
from websockets.asyncio.client import connect as ws_connect

from tests.support import befriend, new_user

# ~6 MB of pushes: past what the socket buffers hold (Linux's default send buffer grows
# to 4 MB; the reader's is kept tiny), and far below the backlog's bound (4096 frames)
N = 400
TEXT = "x" * 15_000


async def test_a_stalled_reader_gets_every_push_once_it_reads_again(url: str) -> None:
    alice, bob = await new_user(url, "fast"), await new_user(url, "stall")
    try:
        conv = await befriend(alice, bob)
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up early
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        # max_queue=1: the client stops reading the socket until recv() is called
        async with ws_connect(
            bob.ws_url(), sock=sock, max_queue=1, compression=None, max_size=1 << 20
        ) as ws:
            sem = asyncio.Semaphore(16)

            async def send(i: int) -> int:
                async with sem:
                    ack = await alice.send_rest(conv, f"{i}:{TEXT}", client_msg_id=f"bp-{i}")
                assert ack["ok"] is True, ack
                return int(ack["seq"])

            seqs = await asyncio.gather(*(send(i) for i in range(N)))
            got: list[int] = []
            while len(got) < N:
                frame = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
                if frame["type"] == "message":
                    got.append(int(frame["message"]["seq"]))
            assert got == sorted(seqs) == list(range(1, N + 1))
            await ws.send('{"type": "ping"}')
            while (frame := orjson.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "pong":
                assert frame["type"] != "message", frame  # nothing sent twice
    finally:
        await alice.aclose()
        await bob.aclose()
