"""The WebSocket endpoint, on plain ASGI: authenticate, register the connection, turn
frames into service calls and results into frames. No store access here.

It sits in front of the FastAPI app (``with_websocket``) rather than inside it: every
frame then goes straight between uvicorn and this code, without the framework's
per-message wrappers (the hot path of the server)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError
from im_server.gateway.fanout import CLOSE_UNAUTHORIZED, Fanout
from im_server.gateway.hub import Conn, Hub
from im_server.ids import ConvRef, parse_conv_id
from im_server.protocol import frames
from im_server.services import accounts, read, send

log = logging.getLogger("im_server.ws")
PATH = "/v1/ws"
MAX_BACKLOG = 4096
CLOSE_TOO_MANY = 1008
CLOSE_TOO_BIG = 1009

ASGIApp = Callable[
    [
        dict[str, Any],
        Callable[[], Awaitable[dict[str, Any]]],
        Callable[[dict[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


class Gateway:
    """Frame handlers of one process."""

    def __init__(self, ctx: Context, hub: Hub, fanout: Fanout) -> None:
        self.ctx = ctx
        self.hub = hub
        self.fanout = fanout
        self.handlers: dict[str, Any] = {
            "send": self.on_send,
            "ping": self.on_ping,
            "read": self.on_read,
            "delivered": self.on_delivered,
            "typing": self.on_typing,
        }

    def on_ping(self, conn: Conn, frame: dict[str, Any]) -> None:
        conn.push(frames.PONG)

    async def on_read(self, conn: Conn, frame: dict[str, Any]) -> None:
        ref, seq = read.check_cursor(frame.get("conv_id"), frame.get("seq"))
        await read.do_cursor(self.ctx, "read", conn.user_id, ref, seq, conn.id)

    async def on_delivered(self, conn: Conn, frame: dict[str, Any]) -> None:
        ref, seq = read.check_cursor(frame.get("conv_id"), frame.get("seq"))
        await read.do_cursor(self.ctx, "delivered", conn.user_id, ref, seq, conn.id)

    async def on_typing(self, conn: Conn, frame: dict[str, Any]) -> None:
        await read.do_typing(self.ctx, conn.user_id, parse_conv_id(frame.get("conv_id")))

    def on_send(self, conn: Conn, frame: dict[str, Any]) -> None:
        """The fast path: validate, queue the script call, and answer from its callback;
        only an answer that needs more work (or an error) goes to a task."""
        cmid = frame.get("client_msg_id")
        try:
            ref, cmid_s, ctype, content_json = send.check_send(self.ctx, conn.user_id, frame)
        except ImError as e:
            metrics.SENDS.labels(e.code).inc()
            conn.push(frames.refused_ack(cmid, e))
            return
        args = send.new_args(self.ctx, conn.user_id, ref, cmid_s, ctype, content_json)
        started = time.perf_counter()
        send.submit(self.ctx, args).add_done_callback(
            lambda f: self._sent(conn, ref, args, started, f)
        )

    def _sent(
        self, conn: Conn, ref: ConvRef, args: Any, started: float, fut: asyncio.Future[Any]
    ) -> None:
        try:
            if not fut.exception():
                out = send.settle(self.ctx, ref, args, fut.result(), conn.id, started)
                if out is not None:
                    conn.push(frames.dumps(out))
                    return
        except ImError as e:
            conn.push(frames.refused_ack(args.client_msg_id, e))
            return
        except Exception:  # noqa: BLE001 - the slow path reports it
            log.exception("send fast path failed")
        self._spawn(conn, self._send_slow(conn, ref, args))

    async def _send_slow(self, conn: Conn, ref: ConvRef, args: Any) -> None:
        try:
            ack = await send.do_send(
                self.ctx,
                conn.user_id,
                ref,
                args.client_msg_id,
                args.content_type,
                args.content_json,
                exclude_conn=conn.id,
            )
        except ImError as e:
            conn.push(frames.refused_ack(args.client_msg_id, e))
            return
        except Exception as e:  # noqa: BLE001 - never lose the socket over one send
            log.exception("send failed")
            conn.push(
                frames.refused_ack(
                    args.client_msg_id, ImError("unavailable", f"send failed: {type(e).__name__}")
                )
            )
            return
        conn.push(frames.dumps(ack))

    def _spawn(self, conn: Conn, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)

    def handle(self, conn: Conn, text: str | bytes) -> None:
        try:
            frame = frames.parse(text)
            handler = self.handlers[frame["type"]]
            result = handler(conn, frame)
            if result is not None:
                self._spawn(conn, self._guard(conn, result))
        except ImError as e:
            metrics.BAD_FRAMES.labels(e.code).inc()
            conn.push(frames.error_frame(e))

    async def _guard(self, conn: Conn, coro: Any) -> None:
        try:
            await coro
        except ImError as e:
            metrics.BAD_FRAMES.labels(e.code).inc()
            conn.push(frames.error_frame(e))
        except Exception as e:  # noqa: BLE001
            log.exception("frame handler failed")
            conn.push(frames.error_frame(ImError("unavailable", f"failed: {type(e).__name__}")))


async def session(gw: Gateway, scope: dict[str, Any], receive: Any, send_: Any) -> None:
    """One WebSocket, from the handshake to the close."""
    ctx = gw.ctx
    if (await receive())["type"] != "websocket.connect":
        return
    token = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token") or [None])[0]
    try:
        user_id, device_id = await accounts.authenticate(ctx, token)
    except ImError as e:
        await send_({"type": "websocket.accept"})
        code = CLOSE_UNAUTHORIZED if e.code == "unauthorized" else 1013
        await send_({"type": "websocket.close", "code": code, "reason": e.message[:120]})
        return
    if gw.hub.user_connections(user_id) >= ctx.settings.max_connections_per_user:
        await send_({"type": "websocket.accept"})
        await send_(
            {
                "type": "websocket.close",
                "code": CLOSE_TOO_MANY,
                "reason": "too many connections for this user",
            }
        )
        return
    # registered (and subscribed across processes) before the handshake completes, so a
    # message sent after the client sees the socket open is never missed
    conn = Conn(user_id, device_id, accounts.token_hash(token or ""), send_, MAX_BACKLOG)
    conn.backlog = collections.deque()  # frames pushed before the accept wait here
    if gw.hub.add(conn):
        await gw.fanout.subscribe_user(user_id)
    try:
        await send_({"type": "websocket.accept"})
        while conn.backlog:
            await send_({"type": "websocket.send", "text": conn.backlog.popleft()})
        conn.backlog = None
        max_frame = ctx.settings.max_frame_bytes
        handle = gw.handle
        while True:
            msg = await receive()
            if msg["type"] != "websocket.receive":
                break
            data = msg.get("text")
            if data is None:
                data = msg.get("bytes") or b""
            if len(data) > max_frame:  # uvicorn enforces it too when started by im-server
                conn.close(CLOSE_TOO_BIG, "frame too large")
                break
            handle(conn, data)
    except Exception:  # noqa: BLE001 - the client went away mid-send
        pass
    finally:
        conn.closing = True
        if gw.hub.remove(conn):
            gw.fanout.user_offline(user_id)
        # in-flight sends are left to finish: their messages are queued and must still
        # reach the other members; only the ack has nowhere to go


def with_websocket(api: Any) -> ASGIApp:
    """The server's ASGI app: ``/v1/ws`` here, everything else to the FastAPI app."""

    async def app(scope: dict[str, Any], receive: Any, send_: Any) -> None:
        if scope["type"] == "websocket" and scope["path"] == PATH:
            await session(api.state.gateway, scope, receive, send_)
        else:
            await api(scope, receive, send_)

    app.api = api  # type: ignore[attr-defined]
    app.state = api.state  # type: ignore[attr-defined]
    return app
