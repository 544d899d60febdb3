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
from im_server.protocol.server_frames import AckOk
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
        """Hand the send to its use case (``services/send.py``) and frame the answer.
        The acks of one socket come back in the order of its frames: a send that needs
        work before its script call (a mention, a reply, an upload) waits for the
        socket's previous one, and so does any send behind it (with other processes
        serving, a send whose sender holds no shared rate token here: a lease of them is
        a round trip first); a plain send with none before it is answered straight from
        the service's callback, without a task."""
        rate = self.ctx.rate.send
        if cmd.plain and conn.send_chain is None and not rate.needs_round_trip(conn.user_id):
            fut = send.accept(self.ctx, conn.user_id, cmd.conv, cmd, exclude_conn=conn.id)
            fut.add_done_callback(lambda f: self._answer(conn, session, cmd.client_msg_id, f))
            return
        self._chain(conn, self._in_turn(conn, session, cmd))

    async def _in_turn(self, conn: Conn, session: Session, cmd: SendCmd) -> None:
        fut = send.accept(self.ctx, conn.user_id, cmd.conv, cmd, exclude_conn=conn.id)
        await asyncio.wait([fut])
        self._answer(conn, session, cmd.client_msg_id, fut)

    @staticmethod
    def _answer(conn: Conn, session: Session, cmid: str, fut: asyncio.Future[AckOk]) -> None:
        if fut.cancelled():
            return
        e = fut.exception()
        if e is None:
            conn.push(session.acked(fut.result()))
        elif isinstance(e, ImError):
            conn.push(session.refused(cmid, e))
        else:  # the service answers everything with an ImError: a bug here
            log.error("send of %s failed: %r", cmid, e)
            conn.push(session.refused(cmid, unavailable("send failed, try again")))

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
        auth = await accounts.authenticate(ctx, token)
    except ImError as e:
        unauthorized = e.code == "unauthorized"
        code = CloseCode.UNAUTHORIZED if unauthorized else CloseCode.TRY_AGAIN
        await refuse(send_, code, e.message)
        return
    user_id, device_id = auth.user_id, auth.device_id
    if gw.hub.user_connections(user_id) >= ctx.settings.max_connections_per_user or not (
        await gw.fanout.claim_socket(user_id)
    ):
        await refuse(send_, CloseCode.TOO_MANY_CONNECTIONS, "too many connections for this user")
        return
    session = Session(user_id, device_id, max_frame_bytes=ctx.settings.max_frame_bytes)
    # registered (and subscribed across processes) before the handshake completes, so a
    # message sent after the client sees the socket open is never missed
    conn = Conn(user_id, device_id, accounts.token_hash(token or ""), send_, MAX_BACKLOG)
    if auth.app_signed:
        conn.issued_at = auth.issued_at or 0
    conn.backlog = collections.deque()  # frames pushed before the accept wait here
    try:
        if gw.hub.add(conn):
            await gw.fanout.subscribe_user(user_id)
    except BaseException:
        gw.fanout.release_socket(user_id)  # claimed above; the finally below is not reached
        gw.hub.remove(conn)
        raise
    if gw.presence is not None and gw.hub.device_connections(user_id, device_id) == 1:
        gw.presence.touch(user_id)  # the device's first socket here (maybe the user's)
    ctx.rate.send.prefetch(user_id)  # with other processes: shared send tokens in hand
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
        gw.fanout.release_socket(user_id)
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
