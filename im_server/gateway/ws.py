"""The WebSocket endpoint: authenticate, register the connection, turn frames into
service calls and results into frames. No store access here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError
from im_server.gateway.fanout import CLOSE_UNAUTHORIZED, Fanout
from im_server.gateway.hub import Conn, Hub
from im_server.ids import parse_conv_id
from im_server.protocol import frames
from im_server.services import accounts, read, send

log = logging.getLogger("im_server.ws")
router = APIRouter()
SEND_QUEUE = 4096
CLOSE_TOO_MANY = 1008


class Gateway:
    """Frame handlers of one process. Services that emit events to other members (read,
    typing...) register more handlers in ``handlers``."""

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
        cmid = frame.get("client_msg_id")
        try:
            ref, cmid_s, ctype, content_json = send.check_send(self.ctx, conn.user_id, frame)
        except ImError as e:
            metrics.SENDS.labels(e.code).inc()
            conn.push(frames.refused_ack(cmid, e))
            return
        task = asyncio.get_running_loop().create_task(
            self._send(conn, ref, cmid_s, ctype, content_json)
        )
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)

    async def _send(self, conn: Conn, ref: Any, cmid: str, ctype: str, content_json: str) -> None:
        try:
            ack = await send.do_send(
                self.ctx, conn.user_id, ref, cmid, ctype, content_json, exclude_conn=conn.id
            )
        except ImError as e:
            conn.push(frames.refused_ack(cmid, e))
            return
        except Exception as e:  # noqa: BLE001 - never lose the socket over one send
            log.exception("send failed")
            conn.push(
                frames.refused_ack(cmid, ImError("unavailable", f"send failed: {type(e).__name__}"))
            )
            return
        conn.push(frames.dumps(ack))

    def handle(self, conn: Conn, text: str | bytes) -> None:
        try:
            frame = frames.parse(text)
            handler = self.handlers.get(frame["type"])
            if handler is None:
                raise ImError("bad_request", f"frame type {frame['type']!r} is not supported")
            result = handler(conn, frame)
            if asyncio.iscoroutine(result):
                task = asyncio.get_running_loop().create_task(self._guard(conn, result))
                conn.tasks.add(task)
                task.add_done_callback(conn.tasks.discard)
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


@router.websocket("/v1/ws")
async def ws_endpoint(websocket: WebSocket) -> None:
    ctx: Context = websocket.app.state.ctx
    gw: Gateway = websocket.app.state.gateway
    token = websocket.query_params.get("token")
    try:
        user_id, device_id = await accounts.authenticate(ctx, token)
    except ImError as e:
        await websocket.accept()
        await websocket.close(
            CLOSE_UNAUTHORIZED if e.code == "unauthorized" else 1013, e.message[:120]
        )
        return
    if gw.hub.user_connections(user_id) >= ctx.settings.max_connections_per_user:
        await websocket.accept()
        await websocket.close(CLOSE_TOO_MANY, "too many connections for this user")
        return

    async def _send(text: str) -> None:
        await websocket.send_text(text)

    async def _close(code: int, reason: str) -> None:
        try:
            if websocket.application_state == WebSocketState.CONNECTED:
                await websocket.close(code, reason)
        except Exception:  # noqa: BLE001 - already gone
            pass

    # registered (and subscribed across processes) before the handshake completes, so a
    # message sent after the client sees the socket open is never missed; frames pushed
    # meanwhile wait in the connection's queue
    conn = Conn(user_id, device_id, accounts.token_hash(token or ""), _send, _close, SEND_QUEUE)
    if gw.hub.add(conn):
        await gw.fanout.subscribe_user(user_id)
    try:
        await websocket.accept()
    except Exception:  # noqa: BLE001 - the client left during the handshake
        if gw.hub.remove(conn):
            gw.fanout.user_offline(user_id)
        return
    writer = asyncio.create_task(_writer(conn))
    max_frame = ctx.settings.max_frame_bytes
    try:
        while True:
            msg = await websocket.receive()
            if msg["type"] == "websocket.disconnect":
                break
            data = msg.get("text")
            if data is None:
                data = msg.get("bytes") or b""
            if len(data) > max_frame:  # uvicorn enforces it too when started by im-server
                conn.close(1009, "frame too large")
                break
            gw.handle(conn, data)
    except WebSocketDisconnect:
        pass
    except RuntimeError:  # receive after close
        pass
    finally:
        conn.closing = True
        if gw.hub.remove(conn):
            gw.fanout.user_offline(user_id)
        writer.cancel()
        # in-flight sends are left to finish: their messages are queued and must still
        # reach the other members; only the ack has nowhere to go


async def _writer(conn: Conn) -> None:
    try:
        await conn.writer()
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the socket is gone; the reader loop ends too
        conn.closing = True
