"""Authorization matrix (PROTOCOL.md, docs/protocol.md): who may see or do what.

Rows are actors that must be refused something: an outsider Z, a kicked group member K, a
removed friend (R1 was removed by A; R2 removed A), a blocked sender X, another user's
token (Z's token aimed at A's resources), a garbage / forged / revoked token, plus a plain
group member B (admin actions) and a friend requester P. Columns are every REST call and
WebSocket frame that touches a conversation, a group or another user's data.

Each cell is a :class:`Case`: the call, and either the contract's refusal ``(status, code)``
or a predicate over the answer (what the actor may see, and nothing more). A refused write
is followed by a check that nothing changed (the next legitimate send gets the very next
seq, memberships / requests / cursors are as before). The world is built once per module;
cells run in list order, and the last cells check that no WebSocket push leaked.
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from im_server.client import ApiError, Client, Connection, group_conv_id, single_conv_id
from im_server.storage.redis import keys as redis_keys
from tests.support import PASSWORD, Stores, befriend, new_user, pg, rds
from tests.support import persisted as _persisted

UNKNOWN_GROUP = 2**62 + 4242
BIG = 10**9


# -- the world -------------------------------------------------------------------------------


@dataclass
class World:
    url: str
    stores: Stores
    users: dict[str, Client]
    ab: str = ""  # s:A:B
    ar1: str = ""  # A removed R1
    ar2: str = ""  # R2 removed A
    ax: str = ""  # A blocked X
    za: str = ""  # Z and A were never friends
    gid: int = 0
    g: str = ""
    kick_seq: int = 0  # K's window ends here
    k_own_seq: int = 0  # a message K sent before the kick
    o_msg_g: int = 0  # O's message in G (before the kick)
    after_kick_seq: int = 0  # O's message in G after the kick
    a_msg_ab: int = 0  # A's message in s:A:B
    req_id: int = 0  # P -> A, pending
    a_pushkey: str = ""  # A's push registration (A's first session)
    k_version: int = 0  # K's sync version right after the kick
    ab_upload: str = ""  # A's file, sent in s:A:B
    a_unsent: str = ""  # A's upload never sent
    g_upload: str = ""  # O's picture in G before the kick (K saw it)
    g_upload_after: str = ""  # O's file in G after the kick (K did not)
    m_own_seq: int = 0  # a message M sent in G before O muted M
    x_own_seq: int = 0  # a message X sent in s:A:X before A blocked X
    end: dict[str, int] = field(default_factory=dict)  # allocated end per conversation
    cursors: dict[tuple[str, str], int] = field(default_factory=dict)  # (user, conv) -> read_seq
    hist: dict[str, list[int]] = field(default_factory=dict)  # seqs at setup, full view
    conns: dict[str, Connection] = field(default_factory=dict)
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Client:  # w.A, w.Z ...
        users = self.__dict__.get("users", {})
        if name in users:
            return users[name]
        raise AttributeError(name)

    def uid(self, name: str) -> int:
        return int(self.users[name].user_id)  # type: ignore[arg-type]


async def _send(c: Client, conv: str, text: str) -> int:
    ack = await c.send_rest(conv, text)
    assert ack["ok"] is True, ack
    return int(ack["seq"])


def _seqs(page: dict[str, Any]) -> list[int]:
    return [m["seq"] for m in page["messages"]]


async def _states(c: Client) -> dict[str, dict[str, Any]]:
    return {s["conv_id"]: s for s in await c.conversations()}


@pytest.fixture(scope="module")
async def world(server: Any, stores: Stores) -> Any:
    url = server.url
    names = ["O", "A", "B", "K", "R1", "R2", "X", "Z", "P", "M"]
    clients = await asyncio.gather(*(new_user(url, n.lower()) for n in names))
    w = World(url, stores, dict(zip(names, clients, strict=True)))
    O, A, B, K, R1, R2, X, Z, P, M = clients  # noqa: E741
    try:
        w.ab, w.ar1, w.ar2, w.ax = await asyncio.gather(
            befriend(A, B), befriend(A, R1), befriend(R2, A), befriend(A, X)
        )
        w.za = single_conv_id(w.uid("Z"), w.uid("A"))

        # single chats with a few messages each
        w.a_msg_ab = await _send(A, w.ab, "ab-1")
        await _send(B, w.ab, "ab-2")
        await _send(A, w.ab, "ab-3")
        w.ab_upload = await A.upload(b"A's file", "text/plain", "a.txt")
        assert (await A.send_rest(w.ab, {"upload_id": w.ab_upload}, "file"))["ok"]
        w.a_unsent = await A.upload(b"A's draft", "text/plain", "draft.txt")
        for conv, peer in ((w.ar1, R1), (w.ar2, R2), (w.ax, X)):
            await _send(A, conv, "from A")
            own = await _send(peer, conv, "to A")
            if conv == w.ax:
                w.x_own_seq = own

        # group G: owner O, members A, B, K, M; K sends, then gets kicked, then more
        # messages; M sends, then O mutes M (until 2100)
        g = await O.create_group("authz", [w.uid(n) for n in ("A", "B", "K", "M")])
        w.gid, w.g = int(g["group_id"]), str(g["conv_id"])
        w.o_msg_g = await _send(O, w.g, "g-1")
        w.m_own_seq = await _send(M, w.g, "g from M")
        await O.mute_member(w.gid, w.uid("M"), MUTED_UNTIL)
        await _send(A, w.g, "g-2")
        w.k_own_seq = await _send(K, w.g, "g-3 from K")
        w.g_upload = await O.upload(b"O's file before the kick", "text/plain", "o1.txt")
        assert (await O.send_rest(w.g, {"upload_id": w.g_upload}, "file"))["ok"]
        await _send(O, w.g, "g-4")
        w.kick_seq = await _send(B, w.g, "g-5")
        await _persisted(O, w.g, w.kick_seq)
        await O.kick(w.gid, w.uid("K"))
        w.k_version = int((await K.sync(since=0))["version"])
        w.after_kick_seq = await _send(O, w.g, "g-after-kick")
        w.g_upload_after = await O.upload(b"O's file after the kick", "text/plain", "o2.txt")
        assert (await O.send_rest(w.g, {"upload_id": w.g_upload_after}, "file"))["ok"]
        last = await _send(A, w.g, "g-after-kick-2")
        await _persisted(O, w.g, last)

        for conv, c in ((w.ab, A), (w.ar1, A), (w.ar2, A), (w.ax, A)):
            await _persisted(c, conv, 2 if conv != w.ab else 4)

        # one-sided removals, a block, a pending request to A
        await A.remove_friend(w.uid("R1"))
        await R2.remove_friend(w.uid("A"))
        await A.block(w.uid("X"))
        w.req_id = await P.request_friend(w.uid("A"))
        w.a_pushkey = secrets.token_hex(32)
        await A.register_push(PUSH_APP, w.a_pushkey, "apns")

        # the other user's token: Z's token on a client that believes it is A
        w.users["other"] = Client(url, token=Z.token, user_id=A.user_id)
        w.users["garbage"] = Client(url, token="garbage-" + uuid.uuid4().hex, user_id=A.user_id)
        tok = A.token or ""
        w.users["forged"] = Client(url, token=tok[:-1] + ("A" if tok[-1:] != "A" else "B"))
        w.users["notoken"] = Client(url, token=None)
        revoked = await Client.login(url, A.username or "", PASSWORD)
        await revoked.logout()
        w.users["revoked"] = revoked

        # what the full viewers see now
        w.hist[w.g] = _seqs(await O.history(w.g))
        w.hist[w.ab] = _seqs(await A.history(w.ab))
        w.hist[w.ar1] = _seqs(await R1.history(w.ar1))
        w.hist[w.ar2] = _seqs(await A.history(w.ar2))
        w.hist[w.ax] = _seqs(await A.history(w.ax))
        for conv, seqs in w.hist.items():
            w.end[conv] = seqs[-1]
        await A.read_rest(w.ab, 2)
        await O.read_rest(w.g, w.o_msg_g)
        for name, conv in (("A", w.ab), ("B", w.ab), ("O", w.g), ("A", w.g), ("B", w.g)):
            w.cursors[(name, conv)] = (await _states(w.users[name]))[conv]["read_seq"]

        # sockets: the actors, and the legitimate members watching for leaks
        for name in ["Z", "K", "R1", "R2", "X", "other", "A", "B", "O", "M"]:
            conn = await w.users[name].connect()
            w.conns[name] = conn
            w.seen[name] = []
            conn.on_event(w.seen[name].append)
        for conn in w.conns.values():
            await conn.ping()
        # pushes flow: a G message and an A-B message reach the members' sockets
        gs = await _send(O, w.g, "g-after-sockets")
        abs_ = await _send(A, w.ab, "ab-after-sockets")
        w.end[w.g], w.end[w.ab] = gs, abs_
        await w.conns["B"].next_event(
            "message",
            predicate=lambda f: f["message"]["seq"] == gs and f["message"]["conv_id"] == w.g,
        )
        await w.conns["B"].next_event(
            "message",
            predicate=lambda f: f["message"]["seq"] == abs_ and f["message"]["conv_id"] == w.ab,
        )
        await _persisted(O, w.g, gs)
        await _persisted(A, w.ab, abs_)
        yield w
    finally:
        for c in w.users.values():
            await c.aclose()


# -- checks that nothing changed -------------------------------------------------------------

LEGIT_SENDER = {"ab": "A", "g": "O", "ax": "A"}


async def unchanged(w: World, key: str) -> None:
    """Nothing was appended to the conversation by the refused call: the next legitimate
    send gets exactly end + 1 (for chats nobody may send to: the persisted end is stable)."""
    conv = getattr(w, key)
    if key in LEGIT_SENDER:
        ack = await w.users[LEGIT_SENDER[key]].send_rest(conv, "sentinel")
        assert ack["ok"] is True, ack
        expected, got = w.end[conv] + 1, int(ack["seq"])
        w.end[conv] = got
        assert got == expected, (
            f"{conv}: a seq was allocated by the refused call (next seq {got}, expected {expected})"
        )
        await _persisted(w.users[LEGIT_SENDER[key]], conv, got)
    else:
        # nobody may send here: Redis's counter of the conversation shows that no seq was
        # handed out (at once, where waiting for the persister could only time out)
        async with rds(w.stores) as r:
            cur = await r.hget(redis_keys.seq(0, conv), "cur")  # one partition: p0
        assert cur is not None and int(cur) == w.end[conv], (
            f"{conv}: a seq was allocated by the refused call (last seq {cur}, end {w.end[conv]})"
        )
        viewer = w.R1 if key == "ar1" else w.A  # the side that kept its history
        page = await viewer.history(conv, order="desc", limit=5)
        assert page["max_seq"] == w.end[conv], f"{conv}: history grew to {page['max_seq']}"


async def appended(w: World, key: str, n: int) -> None:
    """An allowed call appended exactly ``n`` notices: the next legitimate send follows them."""
    w.end[getattr(w, key)] += n
    await unchanged(w, key)


async def m_reads(w: World, page: Any) -> None:
    assert w.m_own_seq in _seqs(page) and page["max_seq"] >= w.end[w.g], page


def unchanged_in(key: str) -> Callable[[World], Awaitable[None]]:
    return lambda w: unchanged(w, key)


async def members_of(w: World) -> dict[int, str]:
    return {m["user_id"]: m["role"] for m in await w.O.members(w.gid)}


async def members_intact(w: World) -> None:
    got = await members_of(w)
    want = {
        w.uid("O"): "owner",
        w.uid("A"): "member",
        w.uid("B"): "member",
        w.uid("M"): "member",
    }
    assert got == want, f"group membership changed: {got} != {want}"


async def request_still_pending(w: World) -> None:
    incoming = [r["request_id"] for r in (await w.A.friend_requests())["incoming"]]
    assert w.req_id in incoming, f"P's request {w.req_id} no longer pending for A: {incoming}"
    assert w.uid("P") not in [f["user_id"] for f in await w.A.friends()]


async def a_state_intact(w: World) -> None:
    """A's window and everyone's read cursors are as before the refused clear/hide/read."""
    st = (await _states(w.A))[w.ab]
    assert st["min_seq"] == 1, f"A's window of {w.ab} moved: {st}"
    for (name, conv), before in w.cursors.items():
        now = (await _states(w.users[name]))[conv]["read_seq"]
        assert now == before, f"{name}'s read cursor in {conv} moved: {before} -> {now}"
    page = await w.A.history(w.ab)
    assert _seqs(page)[0] == 1 and page["max_seq"] == w.end[w.ab], page


async def settings_intact(w: World) -> None:
    """Nobody's muted / pinned moved: a refused settings call changes nothing, and an
    allowed one (K on the group it was kicked from) changes K's row alone."""
    for name, key in (("A", "ab"), ("B", "ab"), ("O", "g"), ("A", "g"), ("B", "g")):
        conv = getattr(w, key)
        st = (await _states(w.users[name]))[conv]
        assert (st["muted"], st["pinned"]) == (False, False), f"{name}'s settings of {conv}: {st}"


async def nothing_visible(w: World, name: str) -> None:
    """The actor's own lists name none of the conversations it is not in."""
    c = w.users[name]
    sync = await c.sync(since=0)
    conv_ids = {s["conv_id"] for s in sync["conversations"]} | set(await _states(c))
    conv_ids |= {x["conv_id"] for x in (await c.unread())["conversations"]}
    allowed = {"K": {w.g}, "R1": {w.ar1}, "R2": {w.ar2}, "X": {w.ax}}.get(name, set())
    leaked = conv_ids - allowed
    assert not leaked, f"{name} sees conversations it is not in: {sorted(leaked)}"


async def a_sessions_intact(w: World) -> None:
    """A's token works and A's device still has its live session."""
    assert (await w.A.me())["user_id"] == w.uid("A")
    devices = [r["device_id"] for r in await w.A.sessions()]
    assert w.A.device_id in devices, f"A's session is gone: {devices}"


PUSH_APP = "com.example.authz"
MUTED_UNTIL = 4102444800000  # 2100-01-01


def upload_of(name: str, which: str, tail: str = "") -> Callable[[World], Awaitable[Any]]:
    """GET /v1/uploads/{upload}{tail} as ``name``, answered as JSON (``redirect=false``)."""

    def run(w: World) -> Awaitable[Any]:
        path = f"/v1/uploads/{getattr(w, which)}{tail}"
        return w.users[name].request("GET", path, params={"redirect": "false"})

    return run


async def got_link(w: World, res: Any) -> None:
    assert set(res) == {"url", "expires_at"} and res["url"].startswith("http"), res


async def a_upload_unsent(w: World) -> None:
    """A's unsent upload is still A's alone, and still unsent."""
    async with pg(w.stores) as db:
        sent = await db.fetchval("SELECT sent_at FROM uploads WHERE upload_id = $1", w.a_unsent)
    assert sent is None, "a refused send made A's upload sent"


async def a_push_intact(w: World) -> None:
    """A's push registration is still there, A's alone."""
    got = await w.A.push_registrations()
    want = {"app_id": PUSH_APP, "pushkey": w.a_pushkey, "platform": "apns"}
    assert got == [{**want, "device_id": w.A.device_id, "data": {}}], (
        f"A's push registration: {got}"
    )


async def only_own_push(w: World, actor: str, rows: Any) -> None:
    """The list is the actor's own: none of A's registrations, only its own devices."""
    client = w.users["Z" if actor == "other" else actor]
    assert all(r["device_id"] == client.device_id for r in rows), rows
    assert w.a_pushkey not in [r["pushkey"] for r in rows], f"{actor} sees A's: {rows}"
    await a_push_intact(w)


async def only_own_sessions(w: World, actor: str, rows: Any) -> None:
    """The list is the actor's own: its own device, none of A's."""
    client = w.users["Z" if actor == "other" else actor]
    devices = [r["device_id"] for r in rows]
    assert devices == [client.device_id], f"{actor} sees sessions {devices}"
    assert rows[0]["current"] is True, rows


async def a_public_profile(w: World, res: Any) -> None:
    assert res == {
        "user_id": w.uid("A"),
        "username": w.A.username,
        "display_name": w.A.username,
        "kind": "user",
    }, f"look-up answered {res}"


# -- WebSocket helpers -----------------------------------------------------------------------


async def ws_frame(w: World, name: str, frame: dict[str, Any]) -> dict[str, Any] | None:
    """Send a raw frame; the error frame that answers it (None if none within 1.5 s)."""
    import orjson

    conn = w.conns[name]
    await conn.send_raw(orjson.dumps(frame).decode())
    return await conn.try_next_event("error", timeout=1.5)


def ws_err(
    name: str, frame: Callable[[World], dict[str, Any]]
) -> Callable[[World], Awaitable[Any]]:
    return lambda w: ws_frame(w, name, frame(w))


def ws_send(name: str, key: str, **extra: Any) -> Callable[[World], Awaitable[Any]]:
    """A ``send`` frame (with any extra fields, e.g. a spoofed ``sender_id``); its ack."""

    async def run(w: World) -> Any:
        import orjson

        conn = w.conns[name]
        conv = getattr(w, key)
        cmid = uuid.uuid4().hex
        body = {
            "type": "send",
            "client_msg_id": cmid,
            "conv_id": conv,
            "content_type": "text",
            "content": {"text": "x"},
            **extra,
        }
        await conn.send_raw(orjson.dumps(body).decode())
        return await conn.next_event(
            "ack", timeout=10.0, predicate=lambda f: f.get("client_msg_id") == cmid
        )

    return run


def ack_refused(code: str) -> Callable[[World, Any], Awaitable[None]]:
    async def check(w: World, ack: Any) -> None:
        assert ack.get("ok") is False and ack.get("code") == code, (
            f"expected ack ok=false code={code}, got {ack}"
        )

    return check


def error_frame(code: str) -> Callable[[World, Any], Awaitable[None]]:
    async def check(w: World, frame: Any) -> None:
        assert frame is not None, f"expected an error frame {code}, got none"
        assert frame.get("code") == code, f"expected error frame {code}, got {frame}"

    return check


async def ws_refused(w: World, name: str) -> Any:
    try:
        conn = await w.users[name].connect()
    except ApiError as exc:
        return ("http", exc.status)
    try:
        return ("close", await conn.wait_closed(timeout=5.0))
    finally:
        await conn.close()


async def ws_refused_ok(w: World, res: Any) -> None:
    assert res in (("http", 401), ("http", 403), ("close", 4401)), f"socket not refused: {res}"


# -- cases -----------------------------------------------------------------------------------

Expect = tuple[int, str] | Callable[[World, Any], Awaitable[None]]


@dataclass
class Case:
    actor: str
    what: str
    call: Callable[[World], Awaitable[Any]]
    expect: Expect
    then: Callable[[World], Awaitable[None]] | None = None

    @property
    def id(self) -> str:
        return f"{self.actor}|{self.what}"


def R(
    name: str, method: str, path: Callable[[World], str], json: Any = None, params: Any = None
) -> Callable[[World], Awaitable[Any]]:
    def run(w: World) -> Awaitable[Any]:
        return w.users[name].request(method, path(w), json=json, params=params)

    return run


def conv_path(key: str, tail: str = "") -> Callable[[World], str]:
    def p(w: World) -> str:
        conv = key if key.startswith(("s:", "g:")) else getattr(w, key)
        if conv == "g:unknown":
            conv = group_conv_id(UNKNOWN_GROUP)
        if conv == "za":
            conv = w.za
        return "/v1/conversations/" + conv + tail

    return p


def search_in(name: str, key: str | None, q: str = "g") -> Callable[[World], Awaitable[Any]]:
    """GET /v1/search as ``name``: over all of its conversations (``key`` None) or one."""

    def run(w: World) -> Awaitable[Any]:
        params = {"q": q}
        if key is not None:
            params["conv_id"] = conv_path(key)(w).removeprefix("/v1/conversations/")
        return w.users[name].request("GET", "/v1/search", params=params)

    return run


def _has_word_prefix(m: dict[str, Any], q: str) -> bool:
    c = m.get("content") or {}
    text = " ".join(str(c.get(k, "")) for k in ("text", "name")).casefold()
    return any(word.startswith(q) for word in re.split(r"\W+", text))


def search_as_history(
    name: str, keys: list[str], q: str = "g", must: Callable[[World], set[int]] | None = None
) -> Callable[[World, Any], Awaitable[None]]:
    """The search page is exactly the messages ``name``'s history shows in ``keys`` whose
    words start with ``q`` (no notice, nothing recalled), the same objects, newest first;
    ``must``: seqs (of the first key's conversation) that have to be among them."""

    async def ok(w: World, page: Any) -> None:
        assert page["next_before"] is None, page
        results = page["results"]
        want: set[tuple[str, int]] = set()
        for key in keys:
            conv = getattr(w, key)
            hist = {m["seq"]: m for m in (await w.users[name].history(conv, limit=500))["messages"]}
            want |= {
                (conv, s)
                for s, m in hist.items()
                if m["content_type"] in ("text", "file", "image")
                and not m.get("recalled")
                and _has_word_prefix(m, q)
            }
            for m in results:
                if m["conv_id"] == conv:
                    assert m == hist.get(m["seq"]), f"{name} found {m} outside its history"
        assert want, f"{name}: nothing to find in {keys} for {q!r} (a useless cell)"
        got = [(m["conv_id"], m["seq"]) for m in results]
        assert set(got) == want and len(got) == len(want), f"{name} found {got}, not {want}"
        times = [m["server_time"] for m in results]
        assert times == sorted(times, reverse=True), times
        if must is not None:
            first = getattr(w, keys[0])
            assert must(w) <= {s for c, s in got if c == first}, (must(w), got)

    return ok


def found_nothing(w: World, page: Any) -> Awaitable[None]:
    async def ok() -> None:
        assert page == {"results": [], "next_before": None}, page

    return ok()


def send_body(content_type: str = "text", content: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "client_msg_id": uuid.uuid4().hex,
        "content_type": content_type,
        "content": content if content is not None else {"text": "x"},
    }


NOT_MEMBER = (403, "not_member")
EDIT_BODY = {"content": {"text": "edited"}}
SETTINGS_BODY = {"muted": True, "pinned": True}
THUMBS = "%F0%9F%91%8D"  # the path segment of 👍
NOT_FOUND = (404, "not_found")
FORBIDDEN = (403, "forbidden")
UNAUTH = (401, "unauthorized")


def conv_cells(
    actor: str,
    key: str,
    expect: tuple[int, str],
    seq: Callable[[World], int] = lambda w: 1,
    writes_check: str | None = None,
) -> list[Case]:
    """The eight conversation endpoints for one (actor, conversation) pair."""
    label = {"ab": "s:A:B", "g": "G", "g:unknown": "unknown group", "za": "s:Z:A"}.get(key, key)
    then = unchanged_in(writes_check) if writes_check else None
    return [
        Case(actor, f"GET history {label}", R(actor, "GET", conv_path(key, "/messages")), expect),
        Case(actor, f"GET search conv_id={label}", search_in(actor, key), expect),
        Case(
            actor, f"GET search conv_id={label}, q punctuation", search_in(actor, key, "?!"), expect
        ),
        Case(
            actor,
            f"POST send {label}",
            lambda w: w.users[actor].request(
                "POST", conv_path(key, "/messages")(w), json=send_body()
            ),
            expect,
            then,
        ),
        Case(
            actor,
            f"POST read {label}",
            R(actor, "POST", conv_path(key, "/read"), json={"seq": BIG}),
            expect,
        ),
        Case(actor, f"POST clear {label}", R(actor, "POST", conv_path(key, "/clear")), expect),
        Case(actor, f"DELETE (hide) {label}", R(actor, "DELETE", conv_path(key)), expect),
        Case(
            actor,
            f"PUT settings {label}",
            R(actor, "PUT", conv_path(key, "/settings"), json=SETTINGS_BODY),
            expect,
            settings_intact,
        ),
        Case(
            actor,
            f"POST recall {label}",
            lambda w: w.users[actor].request(
                "POST", conv_path(key, f"/messages/{seq(w)}/recall")(w)
            ),
            expect,
            then,
        ),
        Case(
            actor,
            f"GET receipts {label}",
            lambda w: w.users[actor].request(
                "GET", conv_path(key, f"/messages/{seq(w)}/receipts")(w)
            ),
            expect,
        ),
        Case(
            actor,
            f"POST edit {label}",
            lambda w: w.users[actor].request(
                "POST", conv_path(key, f"/messages/{seq(w)}/edit")(w), json=EDIT_BODY
            ),
            expect,
            then,
        ),
        Case(
            actor,
            f"PUT reaction {label}",
            lambda w: w.users[actor].request(
                "PUT", conv_path(key, f"/messages/{seq(w)}/reactions/{THUMBS}")(w)
            ),
            expect,
            then,
        ),
        Case(
            actor,
            f"DELETE reaction {label}",
            lambda w: w.users[actor].request(
                "DELETE", conv_path(key, f"/messages/{seq(w)}/reactions/{THUMBS}")(w)
            ),
            expect,
            then,
        ),
    ]


def group_cells(
    actor: str,
    gid: Callable[[World], int],
    expect: tuple[int, str],
    admin_expect: tuple[int, str] | None = None,
    label: str = "G",
) -> list[Case]:
    ae = admin_expect or expect
    then = members_intact if label == "G" else None
    return [
        Case(
            actor,
            f"GET members {label}",
            lambda w: w.users[actor].request("GET", f"/v1/groups/{gid(w)}/members"),
            expect,
        ),
        Case(
            actor,
            f"POST members {label} (add Z)",
            lambda w: w.users[actor].request(
                "POST",
                f"/v1/groups/{gid(w)}/members",
                json={"user_ids": [w.uid("Z"), w.uid("K")], "with_history": True},
            ),
            ae,
            then,
        ),
        Case(
            actor,
            f"DELETE member A from {label}",
            lambda w: w.users[actor].request("DELETE", f"/v1/groups/{gid(w)}/members/{w.uid('A')}"),
            ae,
            then,
        ),
        Case(
            actor,
            f"PUT role A admin in {label}",
            lambda w: w.users[actor].request(
                "PUT", f"/v1/groups/{gid(w)}/members/{w.uid('A')}/role", json={"role": "admin"}
            ),
            ae,
            then,
        ),
        Case(
            actor,
            f"PUT mute A in {label}",
            lambda w: w.users[actor].request(
                "PUT",
                f"/v1/groups/{gid(w)}/members/{w.uid('A')}/mute",
                json={"until": 4102444800000},
            ),
            ae,
            then,
        ),
        Case(
            actor,
            f"POST leave {label}",
            lambda w: w.users[actor].request("POST", f"/v1/groups/{gid(w)}/leave"),
            expect,
            unchanged_in("g") if label == "G" else None,
        ),
    ]


def own_lists_cells(actor: str) -> list[Case]:
    async def call(w: World) -> None:
        await nothing_visible(w, actor)

    async def ok(w: World, _: Any) -> None:
        return None

    return [Case(actor, "GET sync/conversations/unread list only its own", call, ok)]


def ws_cells(actor: str, keys: list[str], code: str = "not_member") -> list[Case]:
    out: list[Case] = []
    for key in keys:
        label = {"ab": "s:A:B", "g": "G"}[key]
        out += [
            Case(
                actor, f"WS send {label}", ws_send(actor, key), ack_refused(code), unchanged_in(key)
            ),
            Case(
                actor,
                f"WS read {label}",
                ws_err(actor, _frame("read", key, BIG)),
                error_frame(code),
            ),
            Case(
                actor,
                f"WS delivered {label}",
                ws_err(
                    actor,
                    _frame("delivered", key, BIG),
                ),
                error_frame(code),
            ),
            Case(
                actor,
                f"WS typing {label}",
                ws_err(actor, _frame("typing", key)),
                error_frame(code),
            ),
            Case(
                actor,
                f"WS edit {label}",
                ws_err(actor, _edit_frame(key, 1)),
                error_frame(code),
                unchanged_in(key),
            ),
        ]
    return out


def _edit_frame(key: str, seq: int) -> Callable[[World], dict[str, Any]]:
    return lambda w: {**_frame("edit", key, seq)(w), "content": {"text": "edited"}}


def accept_cell(actor: str, expect: tuple[int, str] = NOT_FOUND) -> Case:
    return Case(
        actor,
        "POST accept P->A request",
        lambda w: w.users[actor].request("POST", f"/v1/friends/requests/{w.req_id}/accept"),
        expect,
        request_still_pending,
    )


# ---- K: kicked member: sees its closed window and nothing after --------------------------


async def k_history(w: World, page: Any) -> None:
    assert page["max_seq"] == w.kick_seq, (
        f"K's history max_seq {page['max_seq']} != kick seq {w.kick_seq}"
    )
    assert _seqs(page) == [s for s in w.hist[w.g] if s <= w.kick_seq], f"K's history: {_seqs(page)}"


async def k_history_after(w: World, page: Any) -> None:
    assert page["messages"] == [], f"K got messages after its kick: {_seqs(page)}"
    assert page["max_seq"] == w.kick_seq, page


async def k_history_desc(w: World, page: Any) -> None:
    assert max(_seqs(page) or [0]) <= w.kick_seq, f"K got {_seqs(page)}"
    assert page["max_seq"] == w.kick_seq, page


async def k_state(w: World, states: Any) -> None:
    st = {s["conv_id"]: s for s in states}
    assert set(st) == {w.g}, f"K lists {sorted(st)}"
    s = st[w.g]
    assert s["active"] is False, s
    assert s["max_seq"] == w.kick_seq, s
    assert s["last_message"]["seq"] <= w.kick_seq, s
    # K sent kick_seq-3; then O's file (kick_seq-2), O (kick_seq-1) and B (kick_seq): 3
    # unread, nothing after
    assert s["unread"] == 3, s


async def k_sync(w: World, res: Any) -> None:
    st = {s["conv_id"]: s for s in res["conversations"]}
    assert set(st) == {w.g}, f"K syncs {sorted(st)}"
    s = st[w.g]
    assert s["active"] is False and s["max_seq"] == w.kick_seq, s
    assert [m["seq"] for m in s["messages"]] == [x for x in w.hist[w.g] if x <= w.kick_seq][-20:], (
        s["messages"]
    )


async def k_sync_since(w: World, res: Any) -> None:
    for s in res["conversations"]:
        assert s["conv_id"] == w.g and s["max_seq"] == w.kick_seq, s
        assert all(m["seq"] <= w.kick_seq for m in s["messages"]), s["messages"]


async def k_unread(w: World, res: Any) -> None:
    want = [{"conv_id": w.g, "unread": 3, "mention_unread": 0}]
    assert res == {"total": 3, "badge": 3, "conversations": want}, res


async def k_read_clamped(w: World, res: Any) -> None:
    assert res["read_seq"] == w.kick_seq, (
        f"K's read cursor went to {res['read_seq']} (kick at {w.kick_seq})"
    )
    st = (await _states(w.K))[w.g]
    assert st["read_seq"] == w.kick_seq and st["unread"] == 0, st


async def k_ws_read_clamped(w: World, frame: Any) -> None:
    assert frame is None, f"unexpected error frame {frame}"
    # no sleep: waiting 1.5 s for an error frame (ws_frame) outlasted the flush of the
    # report (the cursor batcher writes at once when idle)
    st = (await _states(w.K))[w.g]
    assert st["read_seq"] == w.kick_seq, (
        f"K's read cursor went to {st['read_seq']} (kick at {w.kick_seq})"
    )


async def k_receipts_ok(w: World, res: Any) -> None:
    assert res["seq"] == w.kick_seq - 1, res


# ---- removed friends ------------------------------------------------------------------------


async def full_history(key: str, w: World, page: Any) -> None:
    conv = getattr(w, key)
    want = w.hist[conv] + list(range(w.hist[conv][-1] + 1, w.end[conv] + 1))  # + sentinels
    assert _seqs(page) == want and page["max_seq"] == w.end[conv], (
        f"{conv}: {_seqs(page)} != {want}"
    )


async def empty_window(w: World, page: Any) -> None:
    assert page["messages"] == [], f"the remover still sees {_seqs(page)}"
    assert page["min_seq"] > page["max_seq"], page


async def remover_lists(w: World, remover: str, conv: str) -> None:
    c = w.users[remover]
    assert conv not in await _states(c), f"{remover} still lists {conv}"
    for s in (await c.sync(since=0))["conversations"]:
        if s["conv_id"] == conv:
            assert s["messages"] == [] and s["unread"] == 0, s
            assert s["last_message"] is None, s


async def nonremover_lists(w: World, name: str, conv: str) -> None:
    s = (await _states(w.users[name]))[conv]
    assert s["min_seq"] == 1 and s["max_seq"] == w.end[conv], s


async def k_settings(w: World, res: Any) -> None:
    assert res == {"conv_id": w.g, "muted": True, "pinned": False}, res
    st = (await _states(w.K))[w.g]
    assert (st["active"], st["muted"]) == (False, True), st


def check(fn: Callable[[World], Awaitable[None]]) -> Callable[[World], Awaitable[Any]]:
    return fn


async def _ok(w: World, _: Any) -> None:
    return None


async def _a_schema_only(w: World, res: Any) -> None:
    """The frame schema, and nothing about any user."""
    assert isinstance(res, dict) and set(res["$defs"]) >= {"client_frame", "server_frame"}
    assert "anyOf" in res
    text = str(res)
    assert all(c.username not in text for c in w.users.values() if c.username)


# ---- pushes that must not have leaked (run last) --------------------------------------------


def _about(f: dict[str, Any]) -> tuple[str | None, int | None]:
    if f.get("type") == "message":
        return f["message"]["conv_id"], f["message"]["sender_id"]
    return f.get("conv_id"), f.get("user_id")


async def no_leak_to(w: World, name: str) -> None:
    forbidden = {
        "Z": {w.ab, w.g, w.ar1, w.ar2, w.ax},
        "other": {w.ab, w.g, w.ar1, w.ar2, w.ax},
        "R1": {w.ab, w.g},
        "R2": {w.ab, w.g},
        "X": {w.ab, w.g},
        "K": {w.ab},
    }[name]
    bad = [f for f in w.seen[name] if _about(f)[0] in forbidden]
    # presence is for friends: none of these sees A's (nor A sees theirs)
    bad += [f for f in w.seen[name] if f.get("type") == "presence"]
    bad += [
        f
        for f in w.seen["A"]
        if f.get("type") == "presence"
        and f.get("user_id") == w.uid(name if name != "other" else "Z")
    ]
    if name == "K":  # after the kick, nothing from G
        bad += [
            f
            for f in w.seen[name]
            if _about(f)[0] == w.g and f.get("type") in ("message", "typing")
        ]
    assert not bad, f"{name} received pushes it must not see: {bad[:5]}"


async def no_leak_from(w: World, name: str) -> None:
    """No frame caused by a refused actor reached A, B or O (typing, read, delivered,
    message)."""
    actor = w.uid(name if name != "other" else "Z")
    bad = []
    for watcher in ("A", "B", "O"):
        for f in w.seen[watcher]:
            conv, who = _about(f)
            if who != actor or f.get("type") not in ("message", "typing", "read", "delivered"):
                continue
            if name == "X" and conv == w.ax and f.get("type") in ("typing", "read", "delivered"):
                continue  # X may still type / read in its own chat (no friendship check)
            bad.append((watcher, f))
    assert not bad, f"pushes from {name} reached members: {bad[:5]}"


def _frame(kind: str, key: str, seq: int | None = None) -> Callable[[World], dict[str, Any]]:
    def make(w: World) -> dict[str, Any]:
        f: dict[str, Any] = {"type": kind, "conv_id": getattr(w, key)}
        if seq is not None:
            f["seq"] = seq
        return f

    return make


def _presence_of(name: str, of: str) -> Callable[[World], Awaitable[Any]]:
    async def run(w: World) -> Any:
        return (of, await w.users[name].presence([w.uid(of)]))

    return run


async def _hidden(w: World, res: Any) -> None:
    of, got = res
    assert got == [{"user_id": w.uid(of), "online": None, "last_seen": None}], got


async def _shown(w: World, res: Any) -> None:
    of, got = res
    assert got == [{"user_id": w.uid(of), "online": True, "last_seen": None}], got


async def _ws_refused_as(name: str, w: World) -> Any:
    return await ws_refused(w, name)


async def _no_leak_to_as(name: str, w: World) -> None:
    await no_leak_to(w, name)


async def _no_leak_from_as(name: str, w: World) -> None:
    await no_leak_from(w, name)


def _cases() -> list[Case]:
    cs: list[Case] = []

    # ---------------- Z: outsider ----------------
    cs += conv_cells("Z", "ab", NOT_MEMBER, writes_check="ab")
    cs += conv_cells("Z", "g", NOT_MEMBER, writes_check="g")
    cs += [
        Case(
            "Z",
            "GET history unknown group",
            R("Z", "GET", conv_path("g:unknown", "/messages")),
            NOT_FOUND,
        ),
        Case(
            "Z",
            "GET receipts unknown group",
            R("Z", "GET", conv_path("g:unknown", "/messages/1/receipts")),
            NOT_FOUND,
        ),
        Case(
            "Z",
            "POST clear unknown group",
            R("Z", "POST", conv_path("g:unknown", "/clear")),
            NOT_FOUND,
        ),
        Case(
            "Z",
            "PUT settings unknown group",
            R("Z", "PUT", conv_path("g:unknown", "/settings"), json=SETTINGS_BODY),
            NOT_FOUND,
        ),
        Case(
            "Z",
            "PUT settings s:Z:A (never friends)",
            R("Z", "PUT", conv_path("za", "/settings"), json=SETTINGS_BODY),
            NOT_FOUND,
            settings_intact,
        ),
        Case(
            "Z",
            "POST send unknown group",
            lambda w: w.Z.request("POST", conv_path("g:unknown", "/messages")(w), json=send_body()),
            NOT_MEMBER,
        ),
        Case(
            "Z",
            "GET history s:Z:A (never friends)",
            R("Z", "GET", conv_path("za", "/messages")),
            NOT_FOUND,
        ),
        Case("Z", "GET search conv_id=unknown group", search_in("Z", "g:unknown"), NOT_FOUND),
        Case("Z", "GET search conv_id=s:Z:A (never friends)", search_in("Z", "za"), NOT_FOUND),
        Case("Z", "GET search: nothing of A's, B's or G's", search_in("Z", None), found_nothing),
        Case("Z", "GET search a file name: nothing", search_in("Z", None, "o1"), found_nothing),
        Case(
            "Z",
            "POST send s:Z:A (never friends)",
            lambda w: w.Z.request("POST", conv_path("za", "/messages")(w), json=send_body()),
            (403, "not_friends"),
        ),
        Case("Z", "state of A after Z's refused clear/hide/read", check(a_state_intact), _ok),
    ]
    cs += group_cells("Z", lambda w: w.gid, NOT_MEMBER)
    cs += group_cells("Z", lambda w: UNKNOWN_GROUP, NOT_FOUND, label="unknown group")
    cs += [accept_cell("Z")]
    cs += own_lists_cells("Z")
    cs += ws_cells("Z", ["ab", "g"])
    cs += [Case("Z", "windows and cursors after Z's WS read/delivered", check(a_state_intact), _ok)]
    cs += [
        Case(
            "Z",
            "GET /v1/sessions lists its own only",
            lambda w: w.Z.sessions(),
            lambda w, rows: only_own_sessions(w, "Z", rows),
        ),
        Case(
            "Z",
            "DELETE /v1/sessions/{A's device}",
            lambda w: w.Z.revoke_session(w.A.device_id or ""),
            NOT_FOUND,
            a_sessions_intact,
        ),
        Case(
            "Z",
            "GET /v1/push/registrations lists its own only",
            lambda w: w.Z.push_registrations(),
            lambda w, rows: only_own_push(w, "Z", rows),
        ),
        Case(
            "Z",
            "DELETE /v1/push/registration removes Z's, not A's",
            lambda w: w.Z.unregister_push(),
            _ok,
            a_push_intact,
        ),
        Case(
            "Z",
            "GET /v1/users/lookup A: the public profile only",
            lambda w: w.Z.lookup_user(w.A.username or ""),
            a_public_profile,
        ),
        Case("Z", "GET upload sent in s:A:B", upload_of("Z", "ab_upload"), NOT_FOUND),
        Case("Z", "GET upload sent in G", upload_of("Z", "g_upload"), NOT_FOUND),
        Case(
            "Z",
            "GET thumbnail of an upload sent in G",
            upload_of("Z", "g_upload", "/thumbnail"),
            NOT_FOUND,
        ),
        Case("Z", "GET A's unsent upload", upload_of("Z", "a_unsent"), NOT_FOUND),
        Case(
            "Z",
            "POST send a file naming A's upload (not Z's: refused before the rights)",
            lambda w: w.Z.request(
                "POST",
                conv_path("za", "/messages")(w),
                json=send_body("file", {"upload_id": w.a_unsent}),
            ),
            (400, "bad_request"),
            a_upload_unsent,
        ),
    ]

    # ---------------- K: kicked member ----------------
    cs += [
        Case("K", "GET upload sent in G before the kick", upload_of("K", "g_upload"), got_link),
        Case(
            "K", "GET upload sent in G after the kick", upload_of("K", "g_upload_after"), NOT_FOUND
        ),
    ]
    cs += [
        Case(
            "K",
            "GET history G: up to the kick",
            R("K", "GET", conv_path("g", "/messages")),
            k_history,
        ),
        Case(
            "K",
            "GET history G after the kick seq",
            lambda w: w.K.history(w.g, begin=w.kick_seq + 1, end=BIG),
            k_history_after,
        ),
        Case(
            "K",
            "GET history G desc end=BIG",
            lambda w: w.K.history(w.g, end=BIG, order="desc"),
            k_history_desc,
        ),
        Case(
            "K",
            "GET search G: up to the kick, as history",
            search_in("K", "g"),
            search_as_history("K", ["g"], must=lambda w: {w.o_msg_g, w.k_own_seq, w.kick_seq}),
        ),
        Case(
            "K",
            "GET search (all): G up to the kick, as history",
            search_in("K", None),
            search_as_history("K", ["g"], must=lambda w: {w.kick_seq}),
        ),
        Case(
            "K",
            "GET search after-kick words: nothing",
            search_in("K", None, "after"),
            found_nothing,
        ),
        Case(
            "K",
            "GET search file name before the kick: found",
            search_in("K", "g", "o1"),
            search_as_history("K", ["g"], "o1"),
        ),
        Case(
            "K",
            "GET search file name after the kick: nothing",
            search_in("K", "g", "o2"),
            found_nothing,
        ),
        Case("K", "GET search s:A:B", search_in("K", "ab"), NOT_MEMBER),
        Case(
            "K",
            "GET receipts G seq after kick",
            lambda w: w.K.receipts(w.g, w.after_kick_seq),
            NOT_FOUND,
        ),
        Case(
            "K",
            "GET receipts G kick notice",
            lambda w: w.K.receipts(w.g, w.kick_seq + 1),
            NOT_FOUND,
        ),
        Case(
            "K",
            "GET receipts G inside window (allowed)",
            lambda w: w.K.receipts(w.g, w.kick_seq - 1),
            k_receipts_ok,
        ),
        Case(
            "K", "GET conversations: G inactive at kick seq", lambda w: w.K.conversations(), k_state
        ),
        Case("K", "GET sync since=0: G inactive at kick seq", lambda w: w.K.sync(since=0), k_sync),
        Case(
            "K",
            "GET sync since=kick version: nothing after",
            lambda w: w.K.sync(since=w.k_version),
            k_sync_since,
        ),
        Case("K", "GET unread: only up to the kick", lambda w: w.K.unread(), k_unread),
        Case(
            "K",
            "POST send G",
            lambda w: w.K.request("POST", conv_path("g", "/messages")(w), json=send_body()),
            NOT_MEMBER,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "POST recall own message in G",
            lambda w: w.K.recall(w.g, w.k_own_seq),
            NOT_MEMBER,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "POST recall O's message in G",
            lambda w: w.K.recall(w.g, w.o_msg_g),
            FORBIDDEN,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "POST recall message after kick",
            lambda w: w.K.recall(w.g, w.after_kick_seq),
            NOT_FOUND,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "POST edit own message in G",
            lambda w: w.K.edit(w.g, w.k_own_seq, "after the kick"),
            NOT_MEMBER,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "POST edit O's message in G",
            lambda w: w.K.edit(w.g, w.o_msg_g, "not mine"),
            FORBIDDEN,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "WS edit own message in G",
            lambda w: ws_frame(
                w, "K", {"type": "edit", "conv_id": w.g, "seq": w.k_own_seq, "content": {}}
            ),
            error_frame("not_member"),
            unchanged_in("g"),
        ),
        Case(
            "K",
            "PUT reaction O's message in G (before the kick)",
            lambda w: w.K.react(w.g, w.o_msg_g, "👍"),
            NOT_MEMBER,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "DELETE reaction O's message in G (before the kick)",
            lambda w: w.K.unreact(w.g, w.o_msg_g, "👍"),
            NOT_MEMBER,
            unchanged_in("g"),
        ),
        Case(
            "K",
            "PUT reaction message after kick",
            lambda w: w.K.react(w.g, w.after_kick_seq, "👍"),
            NOT_FOUND,
            unchanged_in("g"),
        ),
        Case("K", "GET history s:A:B", R("K", "GET", conv_path("ab", "/messages")), NOT_MEMBER),
        Case(
            "K",
            "POST read G seq=BIG: clamped at kick",
            lambda w: w.K.read_rest(w.g, BIG),
            k_read_clamped,
        ),
        Case(
            "K",
            "WS read G seq=BIG: clamped at kick",
            ws_err("K", lambda w: {"type": "read", "conv_id": w.g, "seq": BIG}),
            k_ws_read_clamped,
        ),
        Case("K", "WS send G", ws_send("K", "g"), ack_refused("not_member"), unchanged_in("g")),
        Case(
            "K",
            "WS typing G",
            ws_err("K", lambda w: {"type": "typing", "conv_id": w.g}),
            error_frame("not_member"),
        ),
        Case(
            "K", "WS send s:A:B", ws_send("K", "ab"), ack_refused("not_member"), unchanged_in("ab")
        ),
        accept_cell("K"),
        Case(
            "K",
            "PUT settings G (allowed: G is still in K's list), K's row alone",
            lambda w: w.K.conversation_settings(w.g, muted=True),
            k_settings,
            settings_intact,
        ),
    ]
    cs += group_cells("K", lambda w: w.gid, NOT_MEMBER)

    # ---------------- R1: removed by A (the side that keeps its history) ----------------
    cs += [
        Case(
            "R1",
            "POST send s:A:R1",
            lambda w: w.R1.request("POST", conv_path("ar1", "/messages")(w), json=send_body()),
            (403, "not_friends"),
            unchanged_in("ar1"),
        ),
        Case(
            "R1",
            "WS send s:A:R1",
            ws_send("R1", "ar1"),
            ack_refused("not_friends"),
            unchanged_in("ar1"),
        ),
        Case(
            "R1",
            "GET history s:A:R1 (kept)",
            lambda w: w.R1.history(w.ar1),
            lambda w, p: full_history("ar1", w, p),
        ),
        Case("R1", "remover A: history s:A:R1 empty", lambda w: w.A.history(w.ar1), empty_window),
        Case(
            "R1",
            "GET search s:A:R1 (kept), as history",
            search_in("R1", "ar1", "a"),
            search_as_history("R1", ["ar1"], "a"),
        ),
        Case(
            "R1",
            "remover A: search s:A:R1 finds nothing",
            search_in("A", "ar1", "a"),
            found_nothing,
        ),
        Case("R1", "GET search s:A:B", search_in("R1", "ab"), NOT_MEMBER),
        Case(
            "R1",
            "remover A: lists/sync without s:A:R1 messages",
            check(lambda w: remover_lists(w, "A", w.ar1)),
            _ok,
        ),
        Case(
            "R1",
            "remover A: POST send s:A:R1",
            lambda w: w.A.request("POST", conv_path("ar1", "/messages")(w), json=send_body()),
            (403, "not_friends"),
            unchanged_in("ar1"),
        ),
        Case(
            "R1",
            "remover A: receipts of a cleared seq",
            lambda w: w.A.receipts(w.ar1, 1),
            NOT_FOUND,
        ),
        Case(
            "R1",
            "R1 still lists s:A:R1 with history",
            check(lambda w: nonremover_lists(w, "R1", w.ar1)),
            _ok,
        ),
        Case("R1", "GET history s:A:B", R("R1", "GET", conv_path("ab", "/messages")), NOT_MEMBER),
        Case("R1", "GET members G", lambda w: w.R1.members(w.gid), NOT_MEMBER),
        Case(
            "R1",
            "PUT reaction on A's message in s:A:R1 (kept history, removed)",
            lambda w: w.R1.react(w.ar1, 1, "👍"),
            (403, "not_friends"),
            unchanged_in("ar1"),
        ),
        Case(
            "R1",
            "remover A: s:A:R1 stays hidden after R1's refused reaction",
            check(lambda w: remover_lists(w, "A", w.ar1)),
            _ok,
        ),
        accept_cell("R1"),
    ]
    cs += own_lists_cells("R1")
    cs += ws_cells("R1", ["ab"])

    # ---------------- R2: removed A (the remover is the actor) ----------------
    cs += [
        Case(
            "R2",
            "POST send s:A:R2",
            lambda w: w.R2.request("POST", conv_path("ar2", "/messages")(w), json=send_body()),
            (403, "not_friends"),
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "WS send s:A:R2",
            ws_send("R2", "ar2"),
            ack_refused("not_friends"),
            unchanged_in("ar2"),
        ),
        Case(
            "R2", "GET history s:A:R2 (remover: empty)", lambda w: w.R2.history(w.ar2), empty_window
        ),
        Case(
            "R2",
            "GET history s:A:R2 begin=1 (remover: empty)",
            lambda w: w.R2.history(w.ar2, begin=1, end=BIG),
            empty_window,
        ),
        Case(
            "R2",
            "GET receipts s:A:R2 seq 1 (cleared)",
            lambda w: w.R2.receipts(w.ar2, 1),
            NOT_FOUND,
        ),
        Case(
            "R2",
            "POST recall own cleared message",
            lambda w: w.R2.recall(w.ar2, 2),
            NOT_FOUND,
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "POST edit own cleared message",
            lambda w: w.R2.edit(w.ar2, 2, "cleared"),
            NOT_FOUND,
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "PUT reaction cleared message",
            lambda w: w.R2.react(w.ar2, 1, "👍"),
            NOT_FOUND,
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "lists/sync without s:A:R2 messages",
            check(lambda w: remover_lists(w, "R2", w.ar2)),
            _ok,
        ),
        Case(
            "R2", "GET search s:A:R2 (remover): nothing", search_in("R2", "ar2", "a"), found_nothing
        ),
        Case("R2", "GET search (all, remover): nothing", search_in("R2", None, "a"), found_nothing),
        Case(
            "R2",
            "A (not the remover) searches s:A:R2 as history",
            search_in("A", "ar2", "a"),
            search_as_history("A", ["ar2"], "a"),
        ),
        Case("R2", "GET search G", search_in("R2", "g"), NOT_MEMBER),
        Case(
            "R2",
            "A (not the remover) keeps s:A:R2 history",
            lambda w: w.A.history(w.ar2),
            lambda w, p: full_history("ar2", w, p),
        ),
        Case(
            "R2",
            "A: POST send s:A:R2",
            lambda w: w.A.request("POST", conv_path("ar2", "/messages")(w), json=send_body()),
            (403, "not_friends"),
            unchanged_in("ar2"),
        ),
        Case("R2", "GET members G", lambda w: w.R2.members(w.gid), NOT_MEMBER),
        Case("R2", "GET history G", R("R2", "GET", conv_path("g", "/messages")), NOT_MEMBER),
        Case(
            "R2",
            "A (removed by R2): PUT reaction on R2's message",
            lambda w: w.A.react(w.ar2, 2, "👍"),
            (403, "not_friends"),
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "A (removed by R2): POST edit own message",
            lambda w: w.A.edit(w.ar2, 1, "edited"),
            (403, "not_friends"),
            unchanged_in("ar2"),
        ),
        Case(
            "R2",
            "remover R2: s:A:R2 stays hidden after A's refused reaction",
            check(lambda w: remover_lists(w, "R2", w.ar2)),
            _ok,
        ),
    ]
    cs += own_lists_cells("R2")
    cs += ws_cells("R2", ["g"])

    # ---------------- X: blocked by A ----------------
    cs += [
        Case(
            "X",
            "POST send s:A:X",
            lambda w: w.X.request("POST", conv_path("ax", "/messages")(w), json=send_body()),
            (403, "blocked"),
            unchanged_in("ax"),
        ),
        Case("X", "WS send s:A:X", ws_send("X", "ax"), ack_refused("blocked"), unchanged_in("ax")),
        Case(
            "X",
            "WS send s:A:X with sender_id=A",
            lambda w: ws_send("X", "ax", sender_id=w.uid("A"))(w),
            ack_refused("blocked"),
            unchanged_in("ax"),
        ),
        Case(
            "X",
            "GET history s:A:X (still friends)",
            lambda w: w.X.history(w.ax),
            lambda w, p: full_history("ax", w, p),
        ),
        Case(
            "X",
            "GET search s:A:X (still friends), as history",
            search_in("X", "ax", "a"),
            search_as_history("X", ["ax"], "a"),
        ),
        Case("X", "GET search s:A:B", search_in("X", "ab"), NOT_MEMBER),
        Case(
            "X",
            "GET search (all): only s:A:X",
            search_in("X", None, "a"),
            search_as_history("X", ["ax"], "a"),
        ),
        Case("X", "GET history s:A:B", R("X", "GET", conv_path("ab", "/messages")), NOT_MEMBER),
        Case("X", "GET history G", R("X", "GET", conv_path("g", "/messages")), NOT_MEMBER),
        Case("X", "GET members G", lambda w: w.X.members(w.gid), NOT_MEMBER),
        Case(
            "X",
            "PUT reaction on A's message in s:A:X",
            lambda w: w.X.react(w.ax, 1, "👍"),
            (403, "blocked"),
            unchanged_in("ax"),
        ),
        Case(
            "X",
            "DELETE reaction on A's message in s:A:X",
            lambda w: w.X.unreact(w.ax, 1, "👍"),
            (403, "blocked"),
            unchanged_in("ax"),
        ),
        Case(
            "X",
            "POST edit own message in s:A:X",
            lambda w: w.X.edit(w.ax, w.x_own_seq, "edited"),
            (403, "blocked"),
            unchanged_in("ax"),
        ),
        Case(
            "X",
            "WS edit own message in s:A:X",
            ws_err(
                "X",
                lambda w: {
                    "type": "edit",
                    "conv_id": w.ax,
                    "seq": w.x_own_seq,
                    "content": {"text": "edited"},
                },
            ),
            error_frame("blocked"),
            unchanged_in("ax"),
        ),
        Case(
            "X",
            "A (the blocker) reacts on X's message: one way, allowed",
            lambda w: w.A.react(w.ax, w.x_own_seq, "👍"),
            _ok,
            lambda w: appended(w, "ax", 1),
        ),
        Case(
            "X",
            "A takes the reaction back: allowed",
            lambda w: w.A.unreact(w.ax, w.x_own_seq, "👍"),
            _ok,
            lambda w: appended(w, "ax", 1),
        ),
        accept_cell("X"),
    ]
    cs += own_lists_cells("X")
    cs += ws_cells("X", ["ab"])

    # ---------------- M: a group member muted by the owner ----------------
    cs += [
        Case(
            "M",
            "POST send G",
            lambda w: w.M.request("POST", conv_path("g", "/messages")(w), json=send_body()),
            (403, "muted"),
            unchanged_in("g"),
        ),
        Case("M", "WS send G", ws_send("M", "g"), ack_refused("muted"), unchanged_in("g")),
        Case(
            "M",
            "POST edit own message in G",
            lambda w: w.M.edit(w.g, w.m_own_seq, "edited"),
            (403, "muted"),
            unchanged_in("g"),
        ),
        Case(
            "M",
            "PUT reaction on O's message in G",
            lambda w: w.M.react(w.g, w.o_msg_g, "👍"),
            (403, "muted"),
            unchanged_in("g"),
        ),
        Case(
            "M",
            "DELETE reaction on O's message in G",
            lambda w: w.M.unreact(w.g, w.o_msg_g, "👍"),
            (403, "muted"),
            unchanged_in("g"),
        ),
        Case(
            "M",
            "GET history G (a mute keeps reading)",
            lambda w: w.M.history(w.g),
            lambda w, p: m_reads(w, p),
        ),
    ]

    # ---------------- other user's token: Z's token aimed at A's resources ----------------
    async def me_is_z(w: World, res: Any) -> None:
        assert res["user_id"] == w.uid("Z"), f"Z's token acts as {res}"

    async def ab_friends_intact(w: World) -> None:
        assert w.uid("B") in [f["user_id"] for f in await w.A.friends()]
        assert w.uid("A") in [f["user_id"] for f in await w.B.friends()]

    cs += [Case("other", "GET /v1/me is Z, not A", lambda w: w.users["other"].me(), me_is_z)]
    cs += [
        Case(
            "other", "GET search as A: Z's (nothing)", search_in("other", None, "ab"), found_nothing
        ),
        Case("other", "GET search conv_id=G as A", search_in("other", "g"), NOT_MEMBER),
    ]
    cs += conv_cells("other", "ab", NOT_MEMBER, seq=lambda w: w.a_msg_ab, writes_check="ab")
    cs += [
        Case("other", "state of A after refused clear/hide/read", check(a_state_intact), _ok),
        Case(
            "other",
            "POST leave G as A",
            lambda w: w.users["other"].leave(w.gid),
            NOT_MEMBER,
            members_intact,
        ),
        Case(
            "other",
            "DELETE member B from G as A",
            lambda w: w.users["other"].kick(w.gid, w.uid("B")),
            NOT_MEMBER,
            members_intact,
        ),
        Case(
            "other",
            "DELETE /v1/friends/B as A",
            lambda w: w.users["other"].remove_friend(w.uid("B")),
            NOT_FOUND,
            ab_friends_intact,
        ),
        accept_cell("other"),
    ]
    cs += own_lists_cells("other")
    cs += [
        Case(
            "other",
            "GET /v1/sessions lists Z's, not A's",
            lambda w: w.users["other"].sessions(),
            lambda w, rows: only_own_sessions(w, "other", rows),
        ),
        Case(
            "other",
            "DELETE /v1/sessions/{A's device}",
            lambda w: w.users["other"].revoke_session(w.A.device_id or ""),
            NOT_FOUND,
            a_sessions_intact,
        ),
        Case(
            "other",
            "PUT /v1/push/registration ties it to Z's session, not A's",
            lambda w: w.users["other"].register_push(PUSH_APP, "z-" + w.a_pushkey, "fcm"),
            _ok,
            a_push_intact,
        ),
        Case(
            "other",
            "GET /v1/push/registrations lists Z's, not A's",
            lambda w: w.users["other"].push_registrations(),
            lambda w, rows: only_own_push(w, "other", rows),
        ),
        Case(
            "other",
            "DELETE /v1/push/registration removes Z's, not A's",
            lambda w: w.users["other"].unregister_push(),
            _ok,
            a_push_intact,
        ),
        Case(
            "other",
            "PUT /v1/me/password changes Z's, not A's",
            lambda w: w.users["other"].change_password(PASSWORD, PASSWORD),
            _ok,
            a_sessions_intact,
        ),
        Case(
            "other",
            "GET /v1/users/lookup A: the public profile only",
            lambda w: w.users["other"].lookup_user(w.A.username or ""),
            a_public_profile,
        ),
    ]
    cs += [
        Case(
            "other",
            "WS send s:A:B with sender_id=A",
            lambda w: ws_send("other", "ab", sender_id=w.uid("A"), user_id=w.uid("A"))(w),
            ack_refused("not_member"),
            unchanged_in("ab"),
        ),
        Case(
            "other",
            "WS read s:A:B",
            ws_err("other", lambda w: {"type": "read", "conv_id": w.ab, "seq": 1}),
            error_frame("not_member"),
        ),
    ]

    # ---------------- B: member of G and A's friend, with A's uploads ----------------
    cs += [
        Case("B", "GET A's upload sent to B", upload_of("B", "ab_upload"), got_link),
        Case(
            "B", "GET upload sent in G after the kick", upload_of("B", "g_upload_after"), got_link
        ),
        Case("B", "GET A's unsent upload", upload_of("B", "a_unsent"), NOT_FOUND),
        Case(
            "B",
            "POST send a file naming A's unsent upload in s:A:B",
            lambda w: w.B.request(
                "POST",
                conv_path("ab", "/messages")(w),
                json=send_body("file", {"upload_id": w.a_unsent}),
            ),
            (400, "bad_request"),
            a_upload_unsent,
        ),
        Case("B", "the conversation after B's refused file", check(unchanged_in("ab")), _ok),
    ]

    cs += [
        Case(
            "B",
            "GET search G (member): every match, as history",
            search_in("B", "g"),
            search_as_history("B", ["g"], must=lambda w: {w.k_own_seq, w.after_kick_seq}),
        ),
        Case(
            "B",
            "GET search (all): s:A:B and G, as history",
            search_in("B", None, "a"),
            search_as_history("B", ["ab", "g"], "a", must=lambda w: {w.a_msg_ab}),
        ),
        Case(
            "B",
            "GET search a file name sent after the kick",
            search_in("B", "g", "o2"),
            search_as_history("B", ["g"], "o2"),
        ),
    ]

    # ---------------- B: plain member doing admin things ----------------
    cs += [
        Case(
            "B",
            "POST members G (add Z)",
            lambda w: w.B.add_members(w.gid, [w.uid("Z")]),
            FORBIDDEN,
            members_intact,
        ),
        Case(
            "B",
            "DELETE member A from G",
            lambda w: w.B.kick(w.gid, w.uid("A")),
            FORBIDDEN,
            members_intact,
        ),
        Case(
            "B",
            "PUT role B admin (self)",
            lambda w: w.B.request(
                "PUT", f"/v1/groups/{w.gid}/members/{w.uid('B')}/role", json={"role": "admin"}
            ),
            FORBIDDEN,
            members_intact,
        ),
        Case(
            "B",
            "PUT role A admin",
            lambda w: w.B.request(
                "PUT", f"/v1/groups/{w.gid}/members/{w.uid('A')}/role", json={"role": "admin"}
            ),
            FORBIDDEN,
            members_intact,
        ),
        Case(
            "B",
            "PUT mute A",
            lambda w: w.B.request(
                "PUT",
                f"/v1/groups/{w.gid}/members/{w.uid('A')}/mute",
                json={"until": 4102444800000},
            ),
            FORBIDDEN,
            members_intact,
        ),
        Case(
            "B",
            "POST recall O's message in G",
            lambda w: w.B.recall(w.g, w.o_msg_g),
            FORBIDDEN,
            unchanged_in("g"),
        ),
        Case(
            "B",
            "POST recall A's message in s:A:B",
            lambda w: w.B.recall(w.ab, w.a_msg_ab),
            FORBIDDEN,
            unchanged_in("ab"),
        ),
        Case(
            "B",
            "POST edit O's message in G",
            lambda w: w.B.edit(w.g, w.o_msg_g, "not mine"),
            FORBIDDEN,
            unchanged_in("g"),
        ),
        Case(
            "B",
            "POST edit A's message in s:A:B",
            lambda w: w.B.edit(w.ab, w.a_msg_ab, "not mine"),
            FORBIDDEN,
            unchanged_in("ab"),
        ),
        Case(
            "B",
            "POST accept P->A request",
            lambda w: w.B.accept_friend(w.req_id),
            NOT_FOUND,
            request_still_pending,
        ),
        Case(
            "B",
            "POST send G with mention_all",
            lambda w: w.B.request(
                "POST", conv_path("g", "/messages")(w), json={**send_body(), "mention_all": True}
            ),
            FORBIDDEN,
            unchanged_in("g"),
        ),
        Case(
            "B",
            "WS send G with mention_all",
            ws_send("B", "g", mention_all=True),
            ack_refused("forbidden"),
            unchanged_in("g"),
        ),
    ]
    # mentions and replies by those who may not send there at all
    for actor in ("K", "Z"):
        cs += [
            Case(
                actor,
                "POST send G with mentions and reply_to",
                lambda w, a=actor: w.users[a].request(
                    "POST",
                    conv_path("g", "/messages")(w),
                    json={**send_body(), "mentions": [w.uid("A")], "reply_to": 1},
                ),
                NOT_MEMBER,
                unchanged_in("g"),
            ),
            Case(
                actor,
                "WS send G with mention_all",
                ws_send(actor, "g", mention_all=True),
                ack_refused("not_member"),
                unchanged_in("g"),
            ),
        ]
    # P, the requester, accepting or declining its own request; A, its receiver, and the
    # outsider Z cancelling it; Z declining it
    cs += [
        Case(
            "P",
            "POST accept own outgoing request",
            lambda w: w.P.accept_friend(w.req_id),
            NOT_FOUND,
            request_still_pending,
        ),
        Case(
            "P",
            "POST decline own outgoing request",
            lambda w: w.P.request("POST", f"/v1/friends/requests/{w.req_id}/decline"),
            NOT_FOUND,
            request_still_pending,
        ),
        Case(
            "A",
            "DELETE (cancel) a request to me",
            lambda w: w.A.request("DELETE", f"/v1/friends/requests/{w.req_id}"),
            NOT_FOUND,
            request_still_pending,
        ),
        Case(
            "Z",
            "DELETE (cancel) P->A request",
            lambda w: w.Z.request("DELETE", f"/v1/friends/requests/{w.req_id}"),
            NOT_FOUND,
            request_still_pending,
        ),
        Case(
            "Z",
            "POST decline P->A request",
            lambda w: w.Z.request("POST", f"/v1/friends/requests/{w.req_id}/decline"),
            NOT_FOUND,
            request_still_pending,
        ),
    ]

    cs += [
        Case("other", "GET A's upload sent in s:A:B", upload_of("other", "ab_upload"), NOT_FOUND),
        Case("other", "GET A's unsent upload", upload_of("other", "a_unsent"), NOT_FOUND),
    ]

    # ---------------- garbage / forged / revoked / missing token ----------------
    rest = [
        ("GET history s:A:B", "GET", conv_path("ab", "/messages"), None, None),
        ("POST send s:A:B", "POST", conv_path("ab", "/messages"), send_body(), None),
        ("POST read s:A:B", "POST", conv_path("ab", "/read"), {"seq": BIG}, None),
        ("POST clear s:A:B", "POST", conv_path("ab", "/clear"), None, None),
        ("DELETE (hide) s:A:B", "DELETE", conv_path("ab"), None, None),
        ("PUT settings s:A:B", "PUT", conv_path("ab", "/settings"), SETTINGS_BODY, None),
        ("POST recall s:A:B", "POST", conv_path("ab", "/messages/1/recall"), None, None),
        ("GET receipts s:A:B", "GET", conv_path("ab", "/messages/1/receipts"), None, None),
        ("POST edit s:A:B", "POST", conv_path("ab", "/messages/1/edit"), EDIT_BODY, None),
        (
            "PUT reaction s:A:B",
            "PUT",
            conv_path("ab", f"/messages/1/reactions/{THUMBS}"),
            None,
            None,
        ),
        (
            "DELETE reaction s:A:B",
            "DELETE",
            conv_path("ab", f"/messages/1/reactions/{THUMBS}"),
            None,
            None,
        ),
        ("GET members G", "GET", lambda w: f"/v1/groups/{w.gid}/members", None, None),
        (
            "POST members G",
            "POST",
            lambda w: f"/v1/groups/{w.gid}/members",
            {"user_ids": [1]},
            None,
        ),
        (
            "DELETE member G",
            "DELETE",
            lambda w: f"/v1/groups/{w.gid}/members/{w.uid('A')}",
            None,
            None,
        ),
        ("POST leave G", "POST", lambda w: f"/v1/groups/{w.gid}/leave", None, None),
        (
            "PUT role G",
            "PUT",
            lambda w: f"/v1/groups/{w.gid}/members/{w.uid('A')}/role",
            {"role": "admin"},
            None,
        ),
        (
            "PUT mute G",
            "PUT",
            lambda w: f"/v1/groups/{w.gid}/members/{w.uid('A')}/mute",
            {"until": 0},
            None,
        ),
        (
            "POST accept request",
            "POST",
            lambda w: f"/v1/friends/requests/{w.req_id}/accept",
            None,
            None,
        ),
        (
            "POST decline request",
            "POST",
            lambda w: f"/v1/friends/requests/{w.req_id}/decline",
            None,
            None,
        ),
        ("DELETE request", "DELETE", lambda w: f"/v1/friends/requests/{w.req_id}", None, None),
        ("GET sync", "GET", lambda w: "/v1/sync", None, {"since": 0}),
        ("GET unread", "GET", lambda w: "/v1/unread", None, None),
        ("GET conversations", "GET", lambda w: "/v1/conversations", None, None),
        ("GET friends", "GET", lambda w: "/v1/friends", None, None),
        ("GET presence", "GET", lambda w: "/v1/presence", None, {"user_ids": "1"}),
        ("DELETE sessions/current", "DELETE", lambda w: "/v1/sessions/current", None, None),
        ("GET sessions", "GET", lambda w: "/v1/sessions", None, None),
        (
            "DELETE sessions/{A's device}",
            "DELETE",
            lambda w: f"/v1/sessions/{w.A.device_id}",
            None,
            None,
        ),
        ("DELETE sessions (everywhere)", "DELETE", lambda w: "/v1/sessions", None, None),
        (
            "PUT me/password",
            "PUT",
            lambda w: "/v1/me/password",
            {"old_password": PASSWORD, "new_password": "taken-over-1"},
            None,
        ),
        ("DELETE me", "DELETE", lambda w: "/v1/me", {"password": PASSWORD}, None),
        ("GET me/export", "GET", lambda w: "/v1/me/export", None, None),
        ("GET search", "GET", lambda w: "/v1/search", None, {"q": "ab"}),
        ("GET search bad q", "GET", lambda w: "/v1/search", None, {"q": " "}),
        (
            "GET users/lookup A",
            "GET",
            lambda w: "/v1/users/lookup",
            None,
            {"username": "alice"},
        ),
        (
            "PUT push/registration",
            "PUT",
            lambda w: "/v1/push/registration",
            {"app_id": PUSH_APP, "pushkey": "taken-over", "platform": "apns"},
            None,
        ),
        ("DELETE push/registration", "DELETE", lambda w: "/v1/push/registration", None, None),
        ("GET push/registrations", "GET", lambda w: "/v1/push/registrations", None, None),
        ("GET push/config", "GET", lambda w: "/v1/push/config", None, None),
        (
            "POST uploads",
            "POST",
            lambda w: "/v1/uploads",
            {"content_type": "text/plain", "size": 10},
            None,
        ),
        ("GET upload", "GET", lambda w: f"/v1/uploads/{w.ab_upload}", None, None),
        ("GET thumbnail", "GET", lambda w: f"/v1/uploads/{w.g_upload}/thumbnail", None, None),
    ]
    thens: dict[str, Callable[[World], Awaitable[None]]] = {
        "POST send s:A:B": unchanged_in("ab"),
        "POST edit s:A:B": unchanged_in("ab"),
        "PUT reaction s:A:B": unchanged_in("ab"),
        "PUT settings s:A:B": settings_intact,
        "POST leave G": members_intact,
        "DELETE member G": members_intact,
        "POST accept request": request_still_pending,
        "POST decline request": request_still_pending,
        "DELETE request": request_still_pending,
        "PUT push/registration": a_push_intact,
        "DELETE push/registration": a_push_intact,
    }

    async def a_token_alive(w: World) -> None:
        assert (await w.A.me())["user_id"] == w.uid("A")

    thens["DELETE sessions/current"] = a_token_alive
    for what in (
        "DELETE sessions/{A's device}",
        "DELETE sessions (everywhere)",
        "PUT me/password",
        "DELETE me",
    ):
        thens[what] = a_sessions_intact
    for what, method, path, body, params in rest:
        cs.append(
            Case(
                "garbage",
                what,
                R("garbage", method, path, json=body, params=params),
                UNAUTH,
                thens.get(what),
            )
        )
    for variant in ("forged", "revoked", "notoken"):
        for what, method, path, body, params in rest:
            if what in (
                "GET history s:A:B",
                "POST send s:A:B",
                "GET sync",
                "DELETE sessions/current",
                "GET sessions",
                "DELETE sessions/{A's device}",
                "DELETE sessions (everywhere)",
                "PUT me/password",
                "DELETE me",
                "GET me/export",
                "GET search",
                "GET search bad q",
                "GET users/lookup A",
                "GET presence",
                "PUT push/registration",
                "DELETE push/registration",
                "GET push/registrations",
            ):
                cs.append(
                    Case(
                        variant,
                        what,
                        R(variant, method, path, json=body, params=params),
                        UNAUTH,
                        thens.get(what),
                    )
                )
    # presence: friends on both sides only (no removal either way, no block either way)
    for name in ("Z", "other", "K", "R1", "R2", "X"):
        cs.append(Case(name, "GET presence of A: nulls", _presence_of(name, "A"), _hidden))
    for peer in ("Z", "R1", "R2", "X"):
        cs.append(Case("A", f"GET presence of {peer}: nulls", _presence_of("A", peer), _hidden))
    cs.append(Case("B", "GET presence of A (friend, allowed)", _presence_of("B", "A"), _shown))

    # public by design: the frame schema carries no user data, like /openapi.json
    for variant in ("garbage", "notoken"):
        cs.append(
            Case(
                variant,
                "GET protocol/ws-schema (public)",
                R(variant, "GET", lambda w: "/v1/protocol/ws-schema"),
                _a_schema_only,
            )
        )
    for variant in ("garbage", "forged", "revoked", "notoken"):
        cs.append(
            Case(
                variant,
                "WS connect (4401)",
                functools.partial(_ws_refused_as, variant),
                ws_refused_ok,
            )
        )

    # ---------------- last: no push leaked either way ----------------
    for name in ("Z", "other", "K", "R1", "R2", "X"):
        cs.append(
            Case(
                name,
                "WS pushes received: none it may not see",
                functools.partial(_no_leak_to_as, name),
                _ok,
            )
        )
        cs.append(
            Case(
                name,
                "WS pushes caused at members: none",
                functools.partial(_no_leak_from_as, name),
                _ok,
            )
        )
    return cs


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_authorization_cell(world: World, case: Case) -> None:
    cell = f"[{case.actor}] {case.what}"
    if isinstance(case.expect, tuple):
        status, code = case.expect
        try:
            res = await case.call(world)
        except ApiError as e:
            assert (e.status, e.code) == (status, code), (
                f"{cell}: expected {status} {code}, got {e.status} {e.code} ({e.message})"
            )
        else:
            pytest.fail(f"{cell}: expected {status} {code}, got success: {res!r}"[:800])
    else:
        try:
            res = await case.call(world)
        except ApiError as e:
            pytest.fail(f"{cell}: expected success, got {e.status} {e.code} ({e.message})")
        try:
            await case.expect(world, res)
        except AssertionError as e:
            raise AssertionError(f"{cell}: {e}") from None
    if case.then is not None:
        try:
            await case.then(world)
        except AssertionError as e:
            raise AssertionError(f"{cell} (after-check): {e}") from None
