"""The WebSocket endpoint, on plain ASGI: authenticate, register the connection, then move
data. Each received frame goes to the connection's sans-I/O :class:`Session`
(``protocol/session.py``), which holds every rule of the protocol; the command it returns
is carried out here through the services, and the frames the session makes of the
results are pushed. No store access and no frame format here.

It sits in front of the FastAPI app (``with_websocket``) rather than inside it: every
frame then goes straight between uvicorn and this code, without the framework's
per-message wrappers (the hot path of the server).

Errors: a client that went away (the ASGI server's ``ClientDisconnected``, an ``OSError``,
or a ``websocket.disconnect`` event) ends the connection quietly. A refusal (``ImError``)
is answered. A store fault is answered ``unavailable``. Anything else is a bug: logged
with its traceback, counted in ``im_ws_handler_errors_total{where}``, and the socket is
closed with 1011."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import parse_qs

from im_server import metrics
from im_server.context import Context
from im_server.errors import ImError, is_store_error, unavailable
from im_server.gateway.fanout import Fanout
from im_server.gateway.hub import Conn, Hub
from im_server.gateway.presence import PresenceTracker
from im_server.protocol.close_codes import CloseCode
from im_server.protocol.ids import ConvRef
from im_server.protocol.session import (
    Close,
    CursorCmd,
    EditCmd,
    Reply,
    SendCmd,
    Session,
    State,
    TypingCmd,
)
from im_server.services import accounts, edits, read, send
from im_server.storage.redis.store import SendArgs

log = logging.getLogger("im_server.ws")
PATH = "/v1/ws"
MAX_BACKLOG = 4096

# ASGI: an event's keys depend on its "type"; sends are coroutines (``Conn.push`` drives
# one without a task while the socket is writable)
Scope = dict[str, Any]
Event = dict[str, Any]
Receive = Callable[[], Awaitable[Event]]
Send = Callable[[Event], Coroutine[Any, Any, None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GONE = (OSError,)
"""What the ASGI server raises when the client went away (uvicorn's ``ClientDisconnected``
is an ``OSError``, as are transport errors)."""


class Gateway:
    """Carries out the commands of every connection of this process."""

    def __init__(
        self, ctx: Context, hub: Hub, fanout: Fanout, presence: PresenceTracker | None = None
    ) -> None:
        self.ctx = ctx
        self.hub = hub
        self.fanout = fanout
        self.presence = presence

    def handle(self, conn: Conn, session: Session, data: str | bytes) -> Close | None:
        """One received frame; a :class:`Close` is for the receive loop to carry out."""
        cmd = session.receive(data)
        if isinstance(cmd, SendCmd):
            self.on_send(conn, session, cmd)
        elif isinstance(cmd, Reply):
            if cmd.refused is not None:
                (metrics.SENDS if cmd.of_send else metrics.BAD_FRAMES).labels(cmd.refused).inc()
            conn.push(cmd.text)
        elif isinstance(cmd, CursorCmd):
            report = read.do_cursor(self.ctx, cmd.kind, conn.user_id, cmd.conv, cmd.seq, conn.id)
            self._spawn(conn, self._guard(conn, session, cmd.kind, report))
        elif isinstance(cmd, TypingCmd):
            typing = read.do_typing(self.ctx, conn.user_id, cmd.conv)
            self._spawn(conn, self._guard(conn, session, "typing", typing))
        elif isinstance(cmd, EditCmd):
            self._spawn(conn, self._guard(conn, session, "edit", self._edit(conn, session, cmd)))
        else:
            return cmd
        return None

    def on_send(self, conn: Conn, session: Session, cmd: SendCmd) -> None:
        """The fast path: check, queue the script call, and answer from its callback;
        only an answer that needs more work (or an error) goes to a task."""
        try:
            content_json = send.check_send(self.ctx, conn.user_id, cmd.conv, cmd.content)
        except ImError as e:
            metrics.SENDS.labels(e.code).inc()
            conn.push(session.refused(cmd.client_msg_id, e))
            return
        if not cmd.plain:
            self._chain(conn, self._send_with_extras(conn, session, cmd, content_json))
            return
        if conn.send_chain is not None:  # an earlier send is still being checked
            self._chain(conn, self._send_plain(conn, session, cmd, content_json))
            return
        args = send.new_args(
            self.ctx, conn.user_id, cmd.conv, cmd.client_msg_id, cmd.content_type, content_json
        )
        started = time.perf_counter()
        send.submit(self.ctx, args).add_done_callback(
            lambda f: self._sent(conn, session, cmd.conv, args, started, f)
        )

    def _sent(
        self,
        conn: Conn,
        session: Session,
        ref: ConvRef,
        args: SendArgs,
        started: float,
        fut: asyncio.Future[Any],
    ) -> None:
        try:
            if not fut.cancelled() and fut.exception() is None:
                out = send.settle(self.ctx, ref, args, fut.result(), conn.id, started)
                if out is not None:
                    conn.push(session.acked(out))
                    return
        except ImError as e:
            conn.push(session.refused(args.client_msg_id, e))
            return
        except Exception:  # a bug in settle: logged and counted; the slow path answers
            log.exception("send fast path failed")
            metrics.WS_HANDLER_ERRORS.labels("send").inc()
        # a store fault, or an answer that needs work first
        self._spawn(conn, self._send_slow(conn, session, ref, args))

    def _chain(self, conn: Conn, coro: Coroutine[Any, Any, None]) -> None:
        """Run a send after the socket's previous chained send has answered."""
        before = conn.send_chain

        async def in_turn() -> None:
            try:
                if before is not None:
                    await asyncio.wait([before])
            except BaseException:
                coro.close()  # cancelled while waiting (the socket closed): never started
                raise
            await coro

        task = asyncio.get_running_loop().create_task(in_turn())
        conn.tasks.add(task)
        conn.send_chain = task

        def done(t: asyncio.Task[None]) -> None:
            conn.tasks.discard(t)
            if conn.send_chain is t:
                conn.send_chain = None

        task.add_done_callback(done)

    async def _send_plain(
        self, conn: Conn, session: Session, cmd: SendCmd, content_json: str
    ) -> None:
        args = send.new_args(
            self.ctx, conn.user_id, cmd.conv, cmd.client_msg_id, cmd.content_type, content_json
        )
        await self._send_slow(conn, session, cmd.conv, args)

    async def _send_with_extras(
        self, conn: Conn, session: Session, cmd: SendCmd, content_json: str
    ) -> None:
        """A send that mentions, replies or carries an upload: its checks read the
        members, the window or the upload first, so it takes the slow path (a plain send
        never does)."""
        try:
            extras = await send.checked_extras(self.ctx, conn.user_id, cmd.conv, cmd)
        except ImError as e:
            metrics.SENDS.labels(e.code).inc()
            conn.push(session.refused(cmd.client_msg_id, e))
            return
        except Exception as e:  # the task's boundary: the sender must get an ack
            if is_store_error(e):
                log.warning("send to %s failed, a store is unavailable: %r", cmd.conv.conv_id, e)
            else:
                log.exception("send to %s failed", cmd.conv.conv_id)
                metrics.WS_HANDLER_ERRORS.labels("send").inc()
            conn.push(session.refused(cmd.client_msg_id, unavailable("send failed, try again")))
            return
        if not isinstance(extras, send.Extras):
            conn.push(session.acked(extras))  # a repeat of an accepted send
            return
        args = send.new_args(
            self.ctx,
            conn.user_id,
            cmd.conv,
            cmd.client_msg_id,
            cmd.content_type,
            extras.content_json or content_json,
            extras,
        )
        await self._send_slow(conn, session, cmd.conv, args)

    async def _send_slow(self, conn: Conn, session: Session, ref: ConvRef, args: SendArgs) -> None:
        try:
            ack = await send.do_send(
                self.ctx,
                conn.user_id,
                ref,
                args.client_msg_id,
                args.content_type,
                args.content_json,
                exclude_conn=conn.id,
                extras=send.Extras(args.mentions, args.mention_all, args.reply_to),
            )
        except ImError as e:
            conn.push(session.refused(args.client_msg_id, e))
            return
        except Exception as e:  # the task's boundary: the sender must get an ack
            if is_store_error(e):
                log.warning("send to %s failed, a store is unavailable: %r", ref.conv_id, e)
            else:
                log.exception("send to %s failed", ref.conv_id)
                metrics.WS_HANDLER_ERRORS.labels("send").inc()
            # retry-safe: a repeat with the same client_msg_id never makes a second message
            conn.push(session.refused(args.client_msg_id, unavailable("send failed, try again")))
            return
        conn.push(session.acked(ack))

    async def _edit(self, conn: Conn, session: Session, cmd: EditCmd) -> None:
        answer = await edits.do_edit(self.ctx, conn.user_id, cmd.conv, cmd.seq, cmd.content)
        conn.push(session.edited(answer))

    async def _guard(
        self, conn: Conn, session: Session, where: str, work: Awaitable[object]
    ) -> None:
        """Run a read, delivered, typing or edit command; a refusal or a store fault is
        answered with an ``error`` frame, a bug closes the socket."""
        try:
            await work
        except ImError as e:
            metrics.BAD_FRAMES.labels(e.code).inc()
            conn.push(session.failed(e))
        except Exception as e:  # noqa: BLE001 - the task's boundary: classified below
            if is_store_error(e):
                log.warning("%s failed, a store is unavailable: %r", where, e)
                conn.push(session.failed(unavailable()))
            else:
                self.report_bug(conn, session, where)

    def report_bug(self, conn: Conn, session: Session, where: str) -> None:
        """A handler bug (call it from an ``except`` block): log it with its traceback,
        count it, and close the socket (1011); the client reconnects and catches up."""
        log.exception("websocket %s handler failed (connection %d)", where, conn.id)
        metrics.WS_HANDLER_ERRORS.labels(where).inc()
        if session.state is State.OPEN:
            close = session.close(CloseCode.INTERNAL_ERROR, "internal error")
            conn.close(close.code, close.reason)

    def _spawn(self, conn: Conn, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)


async def refuse(send_: Send, code: CloseCode, reason: str) -> None:
    """Accept, then close at once: browsers see the close code, not just a failed
    upgrade."""
    try:
        await send_({"type": "websocket.accept"})
        await send_({"type": "websocket.close", "code": code, "reason": reason[:120]})
    except GONE:
        pass  # the client did not wait for the answer


async def serve(gw: Gateway, scope: Scope, receive: Receive, send_: Send) -> None:
    """One WebSocket, from the handshake to the close."""
    ctx = gw.ctx
    if (await receive())["type"] != "websocket.connect":
        return
    token = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token") or [None])[0]
    try:
        user_id, device_id = await accounts.authenticate(ctx, token)
    except ImError as e:
        unauthorized = e.code == "unauthorized"
        code = CloseCode.UNAUTHORIZED if unauthorized else CloseCode.TRY_AGAIN
        await refuse(send_, code, e.message)
        return
    if gw.hub.user_connections(user_id) >= ctx.settings.max_connections_per_user:
        await refuse(send_, CloseCode.TOO_MANY_CONNECTIONS, "too many connections for this user")
        return
    session = Session(user_id, device_id, max_frame_bytes=ctx.settings.max_frame_bytes)
    # registered (and subscribed across processes) before the handshake completes, so a
    # message sent after the client sees the socket open is never missed
    conn = Conn(user_id, device_id, accounts.token_hash(token or ""), send_, MAX_BACKLOG)
    conn.backlog = collections.deque()  # frames pushed before the accept wait here
    if gw.hub.add(conn):
        await gw.fanout.subscribe_user(user_id)
    if gw.presence is not None and gw.hub.device_connections(user_id, device_id) == 1:
        gw.presence.touch(user_id)  # the device's first socket here (maybe the user's)
    try:
        await send_({"type": "websocket.accept"})
        while conn.backlog and not conn.closing:
            await send_({"type": "websocket.send", "text": conn.backlog.popleft()})
        conn.backlog = None
        scope["headers"] = ()  # not read again; the scope lives as long as the socket
        handle = gw.handle
        while not conn.closing and session.state is State.OPEN:
            msg = await receive()
            if msg["type"] != "websocket.receive":
                break  # websocket.disconnect: the client (or our own close) ended it
            data = msg.get("text")
            if data is None:
                data = msg.get("bytes") or b""
            close = handle(conn, session, data)
            if close is not None:
                conn.close(close.code, close.reason)
    except GONE:
        pass  # the client went away mid-send
    except Exception:  # noqa: BLE001 - the connection's boundary: a bug, logged and counted
        gw.report_bug(conn, session, "receive")
    finally:
        conn.closing = True
        if gw.hub.remove(conn):
            gw.fanout.user_offline(user_id)
        if gw.presence is not None and gw.hub.device_connections(user_id, device_id) == 0:
            gw.presence.touch(user_id)  # the device's last socket here (maybe the user's)
        # in-flight sends are left to finish: their messages are queued and must still
        # reach the other members; only the ack has nowhere to go


def with_websocket(api: Any) -> ASGIApp:
    """The server's ASGI app: ``/v1/ws`` here, everything else to the FastAPI app."""

    async def app(scope: Scope, receive: Receive, send_: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == PATH:
            await serve(api.state.gateway, scope, receive, send_)
        else:
            await api(scope, receive, send_)

    app.api = api  # type: ignore[attr-defined]
    app.state = api.state  # type: ignore[attr-defined]
    return app
