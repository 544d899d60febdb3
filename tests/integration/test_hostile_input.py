"""Hostile input against a real server over the network (DESIGN invariant 8: bad input
gets a clear error and changes nothing).

Property tests use Hypothesis on ``async`` test functions: pytest-asyncio runs every
example on the session event loop, so the function-scoped fixtures (users, an open
WebSocket) are made once per test and shared by all of its examples.

Strings that contain NUL are kept out of message content sent to the shared server: a
NUL in content is valid JSON, and if the server queued it, a stuck stream entry could
spill into other tests. That case has its own test on its own stores
(``test_nul_in_content_is_refused_or_persisted``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from im_server.client import ApiError, Client, Connection
from im_server.client.transport import HttpPool, Response, TransportError
from tests.support import (
    PASSWORD,
    ServerProcess,
    Stores,
    befriend,
    eventually,
    new_user,
    persisted,
    send_ok,
)

CONTRACT_CODES = frozenset(
    {
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "not_member",
        "not_friends",
        "blocked",
        "too_large",
        "rate_limited",
        "conflict",
        "receipts_disabled",
        "unavailable",
    }
)
# the stores are up during these tests: "unavailable" (503, or the WS handler's "failed:
# <Exception>") would be a crash in disguise, so hostile input must never get it
HOSTILE_OK_CODES = CONTRACT_CODES - {"unavailable"}
SEND_REFUSALS = frozenset(
    {"not_friends", "blocked", "not_member", "too_large", "rate_limited", "bad_request"}
)
MAX_ID = 2**63 - 1

HYPO = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


# --------------------------------------------------------------------------------------
# strategies


def _text(*, nul: bool, max_size: int = 24) -> st.SearchStrategy[str]:
    """Random unicode (no surrogates: they are added as samples below)."""
    alphabet = st.characters(codec="utf-8", exclude_characters=None if nul else "\x00")
    return st.text(alphabet, max_size=max_size)


ODD_STRINGS = [
    "",
    " ",
    "null",
    "true",
    "0",
    "-1",
    "1e3",
    "9223372036854775808",
    "99999999999999999999",
    "\u202eevil",
    "\ufeffbom",
    "😀" * 10,
    "a" * 300,
    "b" * 5000,
    "<script>alert(1)</script>",
    "'; DROP TABLE users; --",
    "%00",
    "../../etc/passwd",
    "s:1:2",
    "g:1",
]
WILD_STRINGS = ["\x00", "a\x00b", "\ud800", "x\udfffy", "\udc00\ud800"]  # NUL, lone surrogates


def strings(*, nul: bool) -> st.SearchStrategy[str]:
    samples = ODD_STRINGS + (WILD_STRINGS if nul else ["\ud800", "x\udfffy"])
    return st.one_of(_text(nul=nul), st.sampled_from(samples))


def scalars(*, nul: bool) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-5, max_value=20),
        st.integers(),
        st.integers(min_value=MAX_ID - 2, max_value=2**64 + 2),
        st.integers(min_value=-(2**90), max_value=2**90),
        st.floats(),  # NaN and infinities included (json.dumps writes NaN / Infinity)
        st.sampled_from([0.5, -0.0, 1e308, 1.0, 2.0**63]),
        strings(nul=nul),
    )


def junk(*, nul: bool) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars(nul=nul),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(_text(nul=nul, max_size=8), inner, max_size=4),
        ),
        max_leaves=10,
    )


JUNK_SAFE = junk(nul=False)  # no NUL anywhere: safe inside message content
JUNK_WILD = junk(nul=True)

# conversation placeholders, resolved per test (the users exist only once fixtures ran)
MINE, MINE_REV, FOREIGN, STRANGER, NOGROUP = (
    "@@mine@@",
    "@@mine_rev@@",
    "@@foreign@@",
    "@@stranger@@",
    "@@nogroup@@",
)
BAD_CONV_IDS = [
    "",
    "s:",
    "s:1",
    "s:1:1",
    "s:2:1",
    "s:0:1",
    "s:-1:2",
    "s:01:2",
    "s:1:2:3",
    "S:1:2",
    "s:1:99999999999999999999",
    "s:1:9223372036854775808",
    "g:",
    "g:0",
    "g:-1",
    "g:01",
    "g:1.5",
    "g:1e3",
    "g:99999999999999999999",
    "g:9223372036854775808",
    "g:1:2",
    " g:1",
    "g:1 ",
    "g:1\n",
    "g:\u0661",  # an Arabic-Indic digit
    "x:1:2",
    "g:" + "9" * 200,
]
CONV_ANY = st.one_of(
    st.sampled_from([MINE, MINE, MINE_REV, FOREIGN, STRANGER, NOGROUP]),
    st.sampled_from(BAD_CONV_IDS),
    JUNK_SAFE,
)
SEQ_ANY = st.one_of(
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=-10, max_value=-1),
    st.integers(min_value=MAX_ID - 1, max_value=2**64 - 1),
    st.integers(min_value=2**64, max_value=2**80),
    st.sampled_from([1.0, 1.5, -0.5, 1e30, "1", "", None, True, False, [1], {"seq": 1}]),
    JUNK_SAFE,
)
CMID_VALID = st.from_regex(re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII), fullmatch=True)
CMID_ANY = st.one_of(
    CMID_VALID,
    st.sampled_from(["", "a" * 65, "a b", "é", "../x", "a/b", "x\n", "1" * 1000]),
    JUNK_SAFE,
)
CTYPE_ANY = st.one_of(
    st.just("text"),
    st.sampled_from(["image", "system", "recall", "TEXT", "x" * 33, "", "a b", "1abc"]),
    JUNK_SAFE,
)
CONTENT_ANY = st.one_of(
    st.fixed_dictionaries({"text": _text(nul=False).filter(bool)}),
    st.fixed_dictionaries({"text": JUNK_SAFE}),
    JUNK_SAFE,
)
FRAME_TYPES = ["send", "read", "delivered", "typing", "ping", "edit"]


@st.composite
def frame_objects(draw: st.DrawFn) -> Any:
    fields = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "conv_id": CONV_ANY,
                "seq": SEQ_ANY,
                "client_msg_id": CMID_ANY,
                "content_type": CTYPE_ANY,
                "content": CONTENT_ANY,
            },
        )
    )
    extra = draw(st.dictionaries(_text(nul=False, max_size=10), JUNK_SAFE, max_size=3))
    frame = {**extra, **fields}
    kind = draw(st.integers(0, 9))
    if kind < 7:
        frame["type"] = draw(st.sampled_from(FRAME_TYPES))
    elif kind < 9:
        frame["type"] = draw(st.one_of(_text(nul=False, max_size=12), JUNK_SAFE))
    else:
        frame.pop("type", None)
    return frame


BAD_RAW_TEXTS = [
    "",
    " ",
    "{",
    "}",
    "[]",
    "null",
    "1",
    '"ping"',
    "{type: 'ping'}",
    '{"type": "ping",}',
    '{"type":"ping"}{"type":"ping"}',
    '{"type":"send","type":"nope"}',
    '{"type":"\\ud800"}',
    '{"type":"read","conv_id":"s:1:2","seq":NaN}',
    '{"type":"read","conv_id":"s:1:2","seq":Infinity}',
    '{"type":"read","conv_id":"s:1:2","seq":1e400}',
    '{"type":"ping"\x00}',
    "[" * 5000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    '\ufeff{"type":"ping"}',
]
INVALID_UTF8 = [
    b"\xff",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xe2\x28\xa1",
    b"\xf0\x90\x28\xbc",
    b'{"type":"\xff"}',
]


@dataclass
class WireFrame:
    data: str | bytes
    binary: bool = False


@st.composite
def wire_frames(draw: st.DrawFn) -> tuple[str, Any]:
    """(kind, payload-with-placeholders); serialized once placeholders are resolved."""
    kind = draw(
        st.sampled_from(["object"] * 6 + ["any_json", "raw", "truncated", "binary", "text"])
    )
    if kind == "object":
        return kind, draw(frame_objects())
    if kind == "any_json":
        return kind, draw(JUNK_SAFE)
    if kind == "truncated":
        return kind, (draw(frame_objects()), draw(st.integers(0, 200)))
    if kind == "raw":
        return kind, draw(st.sampled_from(BAD_RAW_TEXTS))
    if kind == "binary":
        return kind, draw(st.one_of(st.binary(max_size=300), st.sampled_from(INVALID_UTF8)))
    return kind, draw(st.text(max_size=200))


# --------------------------------------------------------------------------------------
# the oracle: what the contract says a frame must get

_SINGLE = re.compile(r"s:([1-9][0-9]*):([1-9][0-9]*)", re.ASCII)
_GROUP = re.compile(r"g:([1-9][0-9]*)", re.ASCII)
_CMID = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


def conv_valid(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    m = _SINGLE.fullmatch(v)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        return a < b <= MAX_ID
    m = _GROUP.fullmatch(v)
    return bool(m) and int(m.group(1)) <= MAX_ID  # type: ignore[union-attr]


def seq_valid(v: Any) -> bool:
    """A seq the server must take (and clamp): a whole number from 0 that fits in 64
    bits (every integer of a frame must)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64


@dataclass
class Expect:
    """``kind``: "error" (an error frame is due), "ack" (an ack is due), "pong", or
    "maybe" (a valid frame with nothing due to the sender, or an error)."""

    kind: str
    codes: frozenset[str] = HOSTILE_OK_CODES
    must_refuse: bool = False  # for "ack": ok must be false
    why: str = ""


@dataclass
class Env:
    alice: Client
    bob: Client
    carol: Client
    dave: Client  # no friend of alice
    conn: Connection
    mine: str
    foreign: str  # bob <-> carol: alice is not in it
    extra: dict[str, Any] = field(default_factory=dict)
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)  # client_msg_id -> ack

    def resolve(self, obj: Any) -> Any:
        if isinstance(obj, str):
            a = self.alice.user_id
            return {
                MINE: self.mine,
                MINE_REV: "s:{1}:{0}".format(*sorted((a, self.bob.user_id))),  # type: ignore[type-var]
                FOREIGN: self.foreign,
                STRANGER: "s:{}:{}".format(*sorted((a, self.dave.user_id))),  # type: ignore[type-var]
                NOGROUP: f"g:{MAX_ID}",
            }.get(obj, obj)
        if isinstance(obj, list):
            return [self.resolve(x) for x in obj]
        if isinstance(obj, dict):
            return {self.resolve(k): self.resolve(v) for k, v in obj.items()}
        return obj


def serialize(env: Env, kind: str, payload: Any) -> WireFrame:
    if kind in ("object", "any_json"):
        return WireFrame(json.dumps(env.resolve(payload)))
    if kind == "truncated":
        obj, cut = payload
        text = json.dumps(env.resolve(obj))
        return WireFrame(text[: min(cut, max(len(text) - 1, 0))])
    if kind == "binary":
        return WireFrame(payload, binary=True)
    return WireFrame(payload)


def outside_64_bits(data: str | bytes) -> bool:
    """Whether any integer literal of the JSON text lies outside -2^63 .. 2^64-1."""
    found: list[int] = []

    def note(literal: str) -> int:
        value = int(literal)
        if not -(2**63) <= value <= 2**64 - 1:
            found.append(value)
        return value

    try:
        json.loads(data, parse_int=note)
    except (ValueError, RecursionError):
        return False
    return bool(found)


def expect_for(env: Env, wire: WireFrame) -> Expect:
    bad = Expect("error", frozenset({"bad_request"}))
    try:
        frame = orjson.loads(wire.data)
    except orjson.JSONDecodeError:
        return Expect("error", frozenset({"bad_request"}), why="not JSON")
    if not isinstance(frame, dict):
        return Expect("error", frozenset({"bad_request"}), why="not an object")
    ftype = frame.get("type")
    if not isinstance(ftype, str) or ftype not in FRAME_TYPES:
        return Expect("error", frozenset({"bad_request"}), why="no known type")
    if ftype == "ping":
        return Expect("pong")
    if outside_64_bits(wire.data):
        # the integer rule comes before any field: a send is refused by its ack
        if ftype == "send":
            return Expect("ack", frozenset({"bad_request"}), must_refuse=True, why="int range")
        return Expect("error", frozenset({"bad_request"}), why="int range")
    conv = frame.get("conv_id")
    if ftype == "send":
        defects = []
        if not conv_valid(conv):
            defects.append("conv_id")
        if not (
            isinstance(frame.get("client_msg_id"), str) and _CMID.fullmatch(frame["client_msg_id"])
        ):
            defects.append("client_msg_id")
        if not isinstance(frame.get("content"), dict):
            defects.append("content")
        if "content_type" in frame and not isinstance(frame["content_type"], str):
            defects.append("content_type")
        if defects:
            return Expect(
                "ack", frozenset({"bad_request"}), must_refuse=True, why=",".join(defects)
            )
        if frame["client_msg_id"] in env.accepted:
            # a repeat of an accepted send: the contract answers the first send's ack
            # (wherever this one was going), or a refusal the checks made first
            return Expect("ack", SEND_REFUSALS, why="repeat")
        if conv in (env.foreign, f"g:{MAX_ID}"):
            return Expect("ack", SEND_REFUSALS - {"not_friends"}, must_refuse=True, why="not mine")
        if conv != env.mine:
            return Expect("ack", SEND_REFUSALS, must_refuse=True, why="not mine")
        return Expect("ack", SEND_REFUSALS)
    if not conv_valid(conv):
        return bad
    if ftype in ("read", "delivered", "edit") and not seq_valid(frame.get("seq")):
        return bad
    if ftype == "edit" and not isinstance(frame.get("content"), dict):
        return bad
    outsider = frozenset({"not_member", "not_found", "forbidden"})
    if ftype == "edit":
        # mine: an edit of a message that is not mine, not there, recalled, or content
        # that a text message cannot take; elsewhere: not my conversation
        edit_codes = outsider | {"bad_request", "conflict", "rate_limited", "too_large"}
        if conv == env.mine:
            return Expect("maybe", edit_codes)
        return Expect("error", edit_codes | {"not_friends", "blocked"}, why="edit elsewhere")
    if ftype == "typing":  # typing needs send rights: a single chat with a stranger refuses
        outsider |= {"rate_limited", "not_friends", "blocked"}
    if conv == env.mine:
        return Expect("maybe", frozenset({"rate_limited"}) if ftype == "typing" else frozenset())
    return Expect("error", outsider, why="not my conversation")


def check_frame_shape(ev: dict[str, Any], where: Any) -> None:
    kind = ev.get("type")
    # presence: a friend's socket opening or closing, unrelated to the frame under test;
    # edited: the answer to an edit frame of my own message
    assert kind in ("error", "ack", "pong", "presence", "edited"), (where, ev)
    if kind == "error":
        assert ev.get("code") in HOSTILE_OK_CODES, (where, ev)
        assert isinstance(ev.get("message"), str) and ev["message"], (where, ev)
    if kind == "ack":
        assert isinstance(ev.get("ok"), bool), (where, ev)
        if ev["ok"]:
            assert isinstance(ev.get("seq"), int) and ev["seq"] >= 1, (where, ev)
        else:
            assert ev.get("code") in SEND_REFUSALS, (where, ev)
            assert isinstance(ev.get("message"), str) and ev["message"], (where, ev)


# --------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture
async def env(url: str) -> AsyncIterator[Env]:
    alice, bob, carol, dave = [await new_user(url, p) for p in ("alice", "bob", "carol", "dave")]
    mine = await befriend(alice, bob)
    foreign = await befriend(bob, carol)
    conn = await alice.connect()
    yield Env(alice, bob, carol, dave, conn, mine, foreign)
    for c in (alice, bob, carol, dave):
        await c.aclose()


async def rest(
    url: str,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: bytes | None = None,
    params: dict[str, str] | None = None,
    content_type: str | None = "application/json",
    timeout: float = 15.0,
) -> Response:
    """One raw request on its own connection (a server that fails a request may drop a
    kept-alive connection; a fresh one keeps the examples independent)."""
    headers: dict[str, str] = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None and content_type:
        headers["Content-Type"] = content_type
    async with HttpPool(timeout=timeout) as http:
        return await http.request(method, url + path, content=body, params=params, headers=headers)


def check_error_body(resp: Response, where: Any) -> dict[str, Any]:
    assert resp.status_code < 500, (where, resp.status_code, resp.text[:300])
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(
            (where, resp.status_code, "error body is not JSON", resp.text[:300])
        ) from None
    assert isinstance(body, dict) and set(body) == {"error"}, (where, body)
    err = body["error"]
    assert isinstance(err, dict), (where, body)
    assert err.get("code") in HOSTILE_OK_CODES, (where, body)
    assert isinstance(err.get("message"), str) and err["message"], (where, body)
    return err  # type: ignore[no-any-return]


def check_answer(resp: Response, where: Any) -> None:
    """Never 5xx; any 4xx carries the contract's error body."""
    assert resp.status_code < 500, (where, resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        check_error_body(resp, where)


def c_path(conv_id: str) -> str:
    # a lone surrogate has no UTF-8 form: send its bytes as they would come off the wire
    return "/v1/conversations/" + quote(conv_id.encode("utf-8", "surrogatepass"), safe=":")


# --------------------------------------------------------------------------------------
# 1. any frame gets an answer and the socket stays open


@settings(HYPO, max_examples=200)
@given(frame=wire_frames())
async def test_any_frame_gets_an_answer_and_keeps_the_socket(
    env: Env, frame: tuple[str, Any]
) -> None:
    wire = serialize(env, *frame)
    exp = expect_for(env, wire)
    conn = env.conn
    assert not conn.closed.is_set(), f"socket closed before this frame: {conn.close_code}"
    await conn.send_raw(wire.data, text=not wire.binary)
    where = (exp, wire.data[:300])
    if exp.kind == "error":
        ev = await conn.next_event("error", timeout=5)
        assert ev["code"] in exp.codes, (where, ev)
    elif exp.kind == "ack":
        ev = await conn.next_event("ack", timeout=5)
        check_frame_shape(ev, where)
        if exp.must_refuse:
            assert ev["ok"] is False, (where, ev)
        if ev["ok"] is False:
            assert ev["code"] in exp.codes, (where, ev)
        else:
            first = env.accepted.setdefault(ev["client_msg_id"], ev)
            assert (first["conv_id"], first["seq"]) == (ev["conv_id"], ev["seq"]), (where, ev)
    try:
        await conn.ping(timeout=5)
    except Exception as e:
        raise AssertionError(
            f"no pong after {where}: closed={conn.closed.is_set()} code={conn.close_code} "
            f"reason={conn.close_reason!r} ({e!r})"
        ) from e
    for ev in conn.pending_events():
        check_frame_shape(ev, where)
        if ev["type"] == "error" and exp.kind == "maybe":
            assert ev["code"] in exp.codes | {"not_member"}, (where, ev)
    assert not conn.closed.is_set(), (where, conn.close_code)


# --------------------------------------------------------------------------------------
# 2. refused frames (and refused REST calls) change nothing


BAD_SEQS = st.one_of(
    st.integers(max_value=-1),
    st.sampled_from([1.0, 1.5, 1e30, -0.5, "1", "", None, True, False, [], [3], {"seq": 3}]),
    st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: f != int(f) if f == f else True
    ),
)
BAD_CMIDS = st.one_of(
    st.sampled_from(["", "a" * 65, "a b", "é", "x/y", "x\n", None, 1, True, ["a"], {"a": 1}]),
    _text(nul=False).filter(lambda s: not _CMID.fullmatch(s)),
)
BAD_CTYPES = st.sampled_from(["system", "recall", "TEXT", "x" * 33, "", "a b", 1, None, ["text"]])
BAD_CONTENT = st.one_of(
    st.sampled_from(["hi", 1, None, [], ["text"], True]),
    st.just({"text": ""}),
    st.just({"text": 5}),
    st.just({"text": None}),
    st.just({"nottext": "x"}),
    st.just({"text": "x" * (16 * 1024 + 1)}),
)
BAD_CONVS = st.one_of(st.sampled_from(BAD_CONV_IDS + [MINE_REV]), JUNK_SAFE).filter(
    lambda v: not conv_valid(v)
)


@st.composite
def refused_ops(draw: st.DrawFn) -> dict[str, Any]:
    """One request the server must refuse, as (channel, kind, body)."""
    channel = draw(st.sampled_from(["ws", "ws", "rest"]))
    kind = draw(
        st.sampled_from(["send", "read", "delivered"] if channel == "ws" else ["send", "read"])
    )
    if kind == "send":
        frame: dict[str, Any] = {
            "conv_id": MINE,
            "client_msg_id": uuid.uuid4().hex,
            "content_type": "text",
            "content": {"text": "must not be stored"},
        }
        defect = draw(st.sampled_from(["conv", "cmid", "ctype", "content", "outsider", "missing"]))
        if defect == "conv":
            frame["conv_id"] = draw(BAD_CONVS)
        elif defect == "cmid":
            frame["client_msg_id"] = draw(BAD_CMIDS)
        elif defect == "ctype":
            frame["content_type"] = draw(BAD_CTYPES)
        elif defect == "content":
            frame["content"] = draw(BAD_CONTENT)
        elif defect == "outsider":
            frame["conv_id"] = draw(st.sampled_from([FOREIGN, STRANGER, NOGROUP]))
        else:
            del frame[draw(st.sampled_from(["client_msg_id", "content"]))]
    else:
        defect = draw(st.sampled_from(["seq", "conv", "outsider", "missing"]))
        frame = {"conv_id": MINE, "seq": draw(st.integers(0, 2**63 - 1))}
        if defect == "seq":
            frame["seq"] = draw(BAD_SEQS)
        elif defect == "conv":
            frame["conv_id"] = draw(BAD_CONVS)
        elif defect == "outsider":
            frame["conv_id"] = draw(st.sampled_from([FOREIGN, STRANGER, NOGROUP]))
        else:
            del frame[draw(st.sampled_from(["seq", "conv_id"]))]
    return {"channel": channel, "kind": kind, "frame": frame, "defect": defect}


async def snapshot(env: Env) -> dict[str, Any]:
    """Everything a refused request could have changed, as each user sees it."""
    users = (("alice", env.alice), ("bob", env.bob), ("carol", env.carol), ("dave", env.dave))
    calls: dict[str, Any] = {}
    for name, c in users:
        calls[f"{name}.conversations"] = c.conversations()
        calls[f"{name}.unread"] = c.unread()
    calls["alice.history"] = env.alice.history(env.mine, limit=200)
    calls["bob.history"] = env.bob.history(env.mine, limit=200)
    calls["carol.history"] = env.carol.history(env.foreign, limit=200)
    results = await asyncio.gather(*calls.values())
    out = dict(zip(calls, results, strict=True))
    for name, _ in users:
        out[f"{name}.conversations"].sort(key=lambda s: str(s.get("conv_id")))
    return out


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"{k}:\n  before={before[k]!r}\n  after ={after.get(k)!r}"
        for k in before
        if before[k] != after.get(k)
    ]


@pytest.fixture
async def settled(env: Env) -> AsyncIterator[Env]:
    """A real conversation with history, read and delivered cursors, and unread counts on
    both sides; bob and carol are online (they must receive nothing)."""
    a, b = env.alice, env.bob
    for i in range(3):
        await a.send_rest(env.mine, f"a{i}")
    for i in range(2):
        await b.send_rest(env.mine, f"b{i}")
    await env.carol.send_rest(env.foreign, "c0")
    await a.read_rest(env.mine, 2)
    bc = await b.connect()
    await bc.delivered(env.mine, 4)
    await bc.ping()

    async def persisted() -> bool:
        """Every write above is durable and visible, carol's message included: the
        snapshot below must not catch the setup half done."""
        states = {s["conv_id"]: s for s in await a.conversations()}
        st_ = states.get(env.mine, {})
        foreign = await env.carol.history(env.foreign, limit=1, order="desc")
        return (
            st_.get("max_seq") == 5
            and st_.get("peer_delivered_seq") == 4
            and foreign["max_seq"] == 1
            and len(foreign["messages"]) == 1
        )

    await eventually(persisted)
    cc = await env.carol.connect()
    await cc.ping()
    env.extra.update(bob_conn=bc, carol_conn=cc, before=await snapshot(env))
    yield env
    await bc.close()
    await cc.close()


def _strict_json(text: str) -> bool:
    """What the server can parse (RFC 8259 without NaN, Infinity or lone surrogates)."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


@settings(HYPO, max_examples=100)
@given(ops=st.lists(refused_ops(), min_size=1, max_size=6))
async def test_refused_requests_change_nothing(settled: Env, ops: list[dict[str, Any]]) -> None:
    env = settled
    conn = env.conn
    for op in ops:
        frame = env.resolve(op["frame"])
        where = (op["defect"], op["channel"], op["kind"], json.dumps(frame)[:200])
        if op["channel"] == "ws":
            text = json.dumps({"type": op["kind"], **frame})
            await conn.send_raw(text)
            if op["kind"] == "send" and _strict_json(text):
                ev = await conn.next_event("ack", timeout=5)
                assert ev["ok"] is False and ev["code"] in SEND_REFUSALS, (where, ev)
            elif op["kind"] == "send":  # NaN or a lone surrogate: not a frame at all
                ev = await conn.next_event("error", timeout=5)
                assert ev["code"] == "bad_request", (where, ev)
            else:
                ev = await conn.next_event("error", timeout=5)
                assert ev["code"] in {"bad_request", "not_member", "not_found", "forbidden"}, (
                    where,
                    ev,
                )
        else:
            conv = frame.pop("conv_id", None)
            conv_s = conv if isinstance(conv, str) and conv else "g:0"
            path = c_path(conv_s) + ("/messages" if op["kind"] == "send" else "/read")
            resp = await rest(
                env.alice.base_url,
                "POST",
                path,
                token=env.alice.token,
                body=json.dumps(frame).encode(),
            )
            assert 400 <= resp.status_code < 500, (where, resp.status_code, resp.text[:300])
            check_error_body(resp, where)
    await conn.ping()
    assert not conn.closed.is_set()
    after = await snapshot(env)
    changes = diff(env.extra["before"], after)
    assert not changes, f"refused requests {ops!r} changed state:\n" + "\n".join(changes)


async def test_refused_requests_leave_no_trace_later(settled: Env) -> None:
    """The same refusals as above, then a pause for the persister and the cursor batcher:
    nothing moved, and nobody was told anything."""
    env = settled
    conn = env.conn
    stranger = env.resolve(STRANGER)
    frames: list[dict[str, Any]] = []
    stranger_cmid = "refused-" + uuid.uuid4().hex
    for conv in (env.foreign, stranger, f"g:{MAX_ID}", env.resolve(MINE_REV), "s:1:1"):
        frames.append(
            {
                "type": "send",
                "conv_id": conv,
                "client_msg_id": stranger_cmid if conv == stranger else uuid.uuid4().hex,
                "content": {"text": "x"},
            }
        )
        frames.append({"type": "read", "conv_id": conv, "seq": 3})
        frames.append({"type": "delivered", "conv_id": conv, "seq": 3})
    for bad_seq in (-1, 1.5, "9", None, True, 1e30):
        frames.append({"type": "read", "conv_id": env.mine, "seq": bad_seq})
        frames.append({"type": "delivered", "conv_id": env.mine, "seq": bad_seq})
    frames.append(
        {"type": "send", "conv_id": env.mine, "client_msg_id": "x" * 65, "content": {"text": "x"}}
    )
    frames.append(
        {"type": "send", "conv_id": env.mine, "client_msg_id": "ok-1", "content": {"text": ""}}
    )
    frames.append(
        {
            "type": "send",
            "conv_id": env.mine,
            "client_msg_id": "ok-2",
            "content": {"text": "x" * 20000},
        }
    )
    for f in frames:
        await conn.send_raw(json.dumps(f))
        want = "ack" if f["type"] == "send" else "error"
        ev = await conn.next_event(want, timeout=5)
        if want == "ack":
            assert ev["ok"] is False, (f, ev)
    await conn.ping()
    # under test: nothing changes or arrives within this window. Each refused frame was
    # answered, so its cursor report or send was already settled; receipts go out on a
    # ~1 s timer, so a wrongly counted read would be pushed by then
    await asyncio.sleep(1.5)
    changes = diff(env.extra["before"], await snapshot(env))
    assert not changes, "refused frames changed state:\n" + "\n".join(changes)
    for name in ("bob_conn", "carol_conn"):
        await env.extra[name].ping()  # whatever was pushed before the pong is here
        # presence frames are about the sockets the setup opened, not these frames
        got = [f for f in env.extra[name].pending_events() if f.get("type") != "presence"]
        assert got == [], f"{name} was told about refused frames: {got}"
    # a real send still gets the next seq: refusals took none, and a client_msg_id of a
    # refused send is not remembered as sent
    ok = await conn.send(env.mine, "after the refusals", client_msg_id="ok-1")
    assert (ok["ok"], ok["seq"], ok["duplicate"]) == (True, 6, False), ok

    # hidden state: once alice and dave are friends, the refused send and cursor reports
    # in their (then not yet existing) chat left no seq, no dedupe record and no cursor
    await befriend(env.dave, env.alice)
    first = await conn.send(stranger, "hello dave", client_msg_id=stranger_cmid)
    assert (first["ok"], first["seq"], first["duplicate"]) == (True, 1, False), first
    for i in range(4):
        await env.dave.send_rest(stranger, f"d{i}")

    async def settled_state() -> dict[str, Any] | None:
        states = {s["conv_id"]: s for s in await env.alice.conversations()}
        st_ = states.get(stranger)
        return st_ if st_ and st_["max_seq"] == 5 else None

    st_ = await eventually(settled_state)
    assert (st_["read_seq"], st_["unread"]) == (0, 4), st_
    dave_view = {s["conv_id"]: s for s in await env.dave.conversations()}[stranger]
    assert dave_view.get("peer_read_seq", 0) == 0, dave_view
    assert dave_view.get("peer_delivered_seq", 0) == 0, dave_view


# --------------------------------------------------------------------------------------
# 3. every REST endpoint with random bodies, paths and queries: 4xx, never 5xx

ID_SEGMENTS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.integers(min_value=MAX_ID - 1, max_value=2**64 + 1).map(str),
    st.sampled_from(
        [
            "0",
            "-1",
            "-0",
            "00001",
            "1e3",
            "0x10",
            "1.5",
            "NaN",
            "Infinity",
            "null",
            "true",
            " 1",
            "1 ",
            "+1",
            "1_000",
            "99999999999999999999",
            "9223372036854775808",
            "18446744073709551616",
            "-9223372036854775809",
            "%00",
            "%2F",
            "%25",
            "\u0661",
            "9" * 400,
        ]
    ),
    _text(nul=True, max_size=30).filter(bool).map(lambda s: quote(s, safe="")),
)
CONV_SEGMENTS = st.one_of(
    st.sampled_from([MINE, MINE, MINE_REV, FOREIGN, STRANGER, NOGROUP]),
    st.sampled_from(BAD_CONV_IDS).filter(bool),
    _text(nul=True, max_size=30).filter(bool),
)
# device ids in a path; never "current" (DELETE /v1/sessions/current would revoke the
# token every example uses), nor what a client would resolve as a dot segment
DEVICE_SEGMENTS = st.one_of(
    st.sampled_from(
        ["phone", "d" * 64, "d" * 65, "d" * 5000, "%00", "%ED%A0%80", "%FF", "a%20b", "%2F"]
    ),
    _text(nul=True, max_size=30)
    .filter(lambda s: s not in ("", ".", "..", "current"))
    .map(lambda s: quote(s, safe="")),
)
# reaction emojis in a path: valid ones, over-long, blank, control characters, broken
# encodings, and whatever text (URL-encoded)
EMOJI_SEGMENTS = st.one_of(
    st.sampled_from(
        ["%F0%9F%91%8D", "x" * 33, "%20", "a%20b", "%00", "%ED%A0%80", "%FF", "%0A", "%2F", ""]
    ),
    _text(nul=True, max_size=40)
    .filter(lambda s: s not in ("", ".", ".."))
    .map(lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")),
)
QUERY_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "",
            "-1",
            "1.5",
            "1e3",
            "NaN",
            "nan",
            "-inf",
            "abc",
            "0x1",
            "99999999999999999999",
            "9223372036854775808",
            "%00",
            "\x00",
            "[1]",
            "asc",
            "desc",
            "ASC",
            "9" * 400,
        ]
    ),
    _text(nul=True, max_size=20),
)
# wait is kept short: a valid wait against a quiet since long-polls (up to 30 s)
WAIT_VALUES = st.sampled_from(
    ["", "0", "-0", "0.05", "-1", "-0.5", "nan", "NaN", "abc", "1e", "0x1", "-inf", "-1e400"]
)

BODY_FIELDS: dict[str, list[str]] = {
    "users": ["username", "password", "display_name"],
    "sessions": ["username", "password", "device_id"],
    "friend_request": ["to_user_id", "note"],
    "group": ["name", "member_ids"],
    "add_members": ["user_ids", "with_history"],
    "role": ["role"],
    "send": ["client_msg_id", "content_type", "content"],
    "edit": ["content"],
    "read": ["seq"],
    "settings": ["muted", "pinned"],
    "password": ["old_password", "new_password"],
    "upload": ["content_type", "size", "filename"],
    "push": ["app_id", "pushkey", "platform", "data"],
    "mute": ["until"],
    "delete_me": ["password"],
    "none": [],
}

# (method, path template, body kind, query keys)
ENDPOINTS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("POST", "/v1/users", "users", ()),
    ("POST", "/v1/sessions", "sessions", ()),
    ("POST", "/v1/friends/requests", "friend_request", ()),
    ("POST", "/v1/friends/requests/{id}/accept", "none", ()),
    ("DELETE", "/v1/friends/{id}", "none", ()),
    ("PUT", "/v1/blocks/{id}", "none", ()),
    ("DELETE", "/v1/blocks/{id}", "none", ()),
    ("POST", "/v1/groups", "group", ()),
    ("GET", "/v1/groups/{id}/members", "none", ()),
    ("POST", "/v1/groups/{id}/members", "add_members", ()),
    ("DELETE", "/v1/groups/{id}/members/{id2}", "none", ()),
    ("POST", "/v1/groups/{id}/leave", "none", ()),
    ("PUT", "/v1/groups/{id}/members/{id2}/role", "role", ()),
    ("GET", "/v1/conversations/{conv}/messages", "none", ("begin", "end", "limit", "order")),
    ("POST", "/v1/conversations/{conv}/messages", "send", ()),
    ("POST", "/v1/conversations/{conv}/read", "read", ()),
    ("POST", "/v1/conversations/{conv}/clear", "none", ()),
    ("DELETE", "/v1/conversations/{conv}", "none", ()),
    ("PUT", "/v1/conversations/{conv}/settings", "settings", ()),
    ("POST", "/v1/conversations/{conv}/messages/{id}/recall", "none", ()),
    ("GET", "/v1/conversations/{conv}/messages/{id}/receipts", "none", ()),
    ("POST", "/v1/conversations/{conv}/messages/{id}/edit", "edit", ()),
    ("PUT", "/v1/conversations/{conv}/messages/{id}/reactions/{emoji}", "none", ()),
    ("DELETE", "/v1/conversations/{conv}/messages/{id}/reactions/{emoji}", "none", ()),
    ("GET", "/v1/unread", "none", ("x", "since")),
    ("GET", "/v1/sync", "none", ("since", "wait", "limit", "recent")),
    ("GET", "/v1/sessions", "none", ()),
    # not DELETE /v1/sessions: it would revoke the token every example uses
    ("DELETE", "/v1/sessions/{dev}", "none", ()),
    ("PUT", "/v1/me/password", "password", ()),
    ("GET", "/v1/users/lookup", "none", ("username",)),
    ("GET", "/v1/search", "none", ("q", "conv_id", "limit", "before")),
    ("GET", "/v1/users/{id}", "none", ()),
    ("GET", "/v1/me", "none", ()),
    ("GET", "/v1/me/export", "none", ()),
    # the password is never the user's: this can only be refused
    ("DELETE", "/v1/me", "delete_me", ()),
    ("PUT", "/v1/groups/{id}/members/{id2}/mute", "mute", ()),
    ("POST", "/v1/uploads", "upload", ()),
    ("GET", "/v1/uploads/{up}", "none", ("redirect",)),
    ("GET", "/v1/uploads/{up}/thumbnail", "none", ("redirect",)),
    ("GET", "/v1/presence", "none", ("user_ids",)),
    ("PUT", "/v1/push/registration", "push", ()),
    ("DELETE", "/v1/push/registration", "none", ()),
    ("GET", "/v1/push/registrations", "none", ()),
]
# upload ids in a path: well-formed but unknown, and whatever text (URL-encoded)
UPLOAD_SEGMENTS = st.one_of(
    st.uuids().map(str),
    st.sampled_from(["0", "-1", "u" * 200, "%00", "%FF", "%2F", "a%20b", "..%2F..%2Fetc"]),
    _text(nul=True, max_size=40)
    .filter(lambda s: s not in ("", ".", ".."))
    .map(lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")),
)

RAW_BODIES = [
    b"",
    b"{",
    b"}",
    b"[]",
    b"null",
    b"1",
    b'"x"',
    b"{'a': 1}",
    b'{"a": 1,}',
    b"\xff\xfe\x00",
    b'{"username": "\xff"}',
    b"NaN",
    b'{"seq": NaN}',
    b'{"seq": Infinity}',
    b'{"seq": -Infinity}',
    b'{"seq": 1e400}',
    b'{"seq": 99999999999999999999999999}',
    b'{"to_user_id": 99999999999999999999999}',
    b'{"user_ids": [99999999999999999999]}',
    b'{"name": "\\ud800"}',
    b'{"name": "a\\u0000b", "member_ids": []}',
    b"[" * 3000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b"x" * 200_000,
]


@st.composite
def rest_requests(draw: st.DrawFn) -> dict[str, Any]:
    method, template, kind, qkeys = draw(st.sampled_from(ENDPOINTS))
    path = template
    for key, seg in (
        ("{conv}", CONV_SEGMENTS),
        ("{id2}", ID_SEGMENTS),
        ("{id}", ID_SEGMENTS),
        ("{dev}", DEVICE_SEGMENTS),
        ("{emoji}", EMOJI_SEGMENTS),
        ("{up}", UPLOAD_SEGMENTS),
    ):
        if key in path:
            path = path.replace(
                key, draw(seg) if key != "{conv}" else "@C@" + str(draw(seg)) + "@C@"
            )
    params: dict[str, str] = {}
    for k in qkeys:
        if draw(st.booleans()):
            params[k] = draw(WAIT_VALUES if k == "wait" else QUERY_VALUES)
    # message content must stay NUL-free on the shared server (see the module doc)
    values = JUNK_SAFE if kind in ("send", "edit") else JUNK_WILD
    body_kind = draw(st.sampled_from(["object", "object", "object", "raw", "any", "none"]))
    body: Any
    if body_kind == "object":
        fields = BODY_FIELDS[kind] or ["x"]
        body = draw(
            st.fixed_dictionaries({}, optional={f: values for f in fields}).flatmap(
                lambda d: st.dictionaries(_text(nul=False, max_size=8), values, max_size=2).map(
                    lambda extra: {**extra, **d}
                )
            )
        )
    elif body_kind == "raw":
        body = draw(st.one_of(st.sampled_from(RAW_BODIES), st.binary(max_size=200)))
    elif body_kind == "any":
        body = draw(values)
    else:
        body = None
    ctype = draw(
        st.sampled_from(
            ["application/json"] * 5 + ["text/plain", "application/x-www-form-urlencoded", None]
        )
    )
    auth = draw(st.sampled_from(["alice"] * 8 + ["none", "garbage"]))
    return {
        "method": method,
        "template": template,
        "path": path,
        "params": params,
        "body": body,
        "body_kind": body_kind,
        "ctype": ctype,
        "auth": auth,
    }


def _resolve_path(env: Env, path: str) -> str:
    parts = path.split("@C@")
    for i in range(1, len(parts), 2):
        parts[i] = quote(str(env.resolve(parts[i])), safe=":")
    return "".join(parts)


@settings(HYPO, max_examples=250)
@given(req=rest_requests())
async def test_every_rest_endpoint_answers_4xx_not_5xx(env: Env, req: dict[str, Any]) -> None:
    path = _resolve_path(env, req["path"])
    body = req["body"]
    if req["body_kind"] in ("object", "any"):
        body = json.dumps(env.resolve(body)).encode("utf-8", "surrogatepass")
    token = {"alice": env.alice.token, "none": None, "garbage": "x" * 300}[req["auth"]]
    try:
        resp = await rest(
            env.alice.base_url,
            req["method"],
            path,
            token=token,
            body=body,
            params=req["params"],
            content_type=req["ctype"],
            timeout=40.0,
        )
    except TransportError as e:
        raise AssertionError(
            f"connection failed for {req['method']} {path} {req['params']}: {e!r}"
        ) from e
    where = (
        req["method"],
        path,
        req["params"],
        (body or b"")[:200] if isinstance(body, bytes) else body,
    )
    check_answer(resp, where)


def _rest_cases() -> list[tuple[str, str, bytes | None, dict[str, str] | None, set[int]]]:
    big = "99999999999999999999"
    cases: list[tuple[str, str, bytes | None, dict[str, str] | None, set[int]]] = [
        ("POST", f"/v1/friends/requests/{big}/accept", None, None, {400, 404, 422}),
        ("POST", "/v1/friends/requests/-1/accept", None, None, {400, 404, 422}),
        ("POST", "/v1/friends/requests/9223372036854775808/accept", None, None, {400, 404, 422}),
        ("DELETE", f"/v1/friends/{big}", None, None, {400, 404, 422}),
        ("DELETE", "/v1/friends/-1", None, None, {400, 404, 422}),
        ("PUT", f"/v1/blocks/{big}", None, None, {400, 404, 422}),
        ("PUT", "/v1/blocks/-1", None, None, {400, 404, 422}),
        ("DELETE", f"/v1/blocks/{big}", None, None, {400, 404, 422}),
        ("GET", "/v1/groups/-1/members", None, None, {400, 403, 404, 422}),
        ("GET", f"/v1/groups/{big}/members", None, None, {400, 403, 404, 422}),
        ("GET", "/v1/groups/9223372036854775808/members", None, None, {400, 403, 404, 422}),
        ("POST", "/v1/groups/-1/members", b'{"user_ids": [1]}', None, {400, 403, 404, 422}),
        ("POST", f"/v1/groups/{big}/members", b'{"user_ids": [1]}', None, {400, 403, 404, 422}),
        ("DELETE", f"/v1/groups/1/members/{big}", None, None, {400, 403, 404, 422}),
        ("DELETE", f"/v1/groups/{big}/members/1", None, None, {400, 403, 404, 422}),
        ("POST", f"/v1/groups/{big}/leave", None, None, {400, 403, 404, 422}),
        (
            "PUT",
            f"/v1/groups/{big}/members/1/role",
            b'{"role":"admin"}',
            None,
            {400, 403, 404, 422},
        ),
        (
            "PUT",
            f"/v1/groups/1/members/{big}/role",
            b'{"role":"admin"}',
            None,
            {400, 403, 404, 422},
        ),
        ("GET", "/v1/conversations/s:1:2/messages", None, {"begin": big}, {400, 403, 404}),
        (
            "GET",
            "/v1/conversations/s:1:2/messages",
            None,
            {"begin": "5", "end": "1"},
            {400, 403, 404},
        ),
        ("GET", "/v1/conversations/s:1:2/messages", None, {"limit": "-1"}, {400, 403, 404}),
        ("GET", "/v1/conversations/s:1:2/messages", None, {"order": "sideways"}, {400, 403, 404}),
        ("GET", "/v1/conversations/x%00y/messages", None, None, {400, 404}),
        (
            "GET",
            "/v1/conversations/s:1:2/messages/99999999999999999999/receipts",
            None,
            None,
            {400, 403, 404},
        ),
        ("POST", "/v1/conversations/s:1:2/messages/-5/recall", None, None, {400, 403, 404}),
        (
            "POST",
            "/v1/conversations/s:1:2/messages/99999999999999999999/recall",
            None,
            None,
            {400, 403, 404},
        ),
        ("GET", "/v1/sync", None, {"since": "-1"}, {400}),
        ("GET", "/v1/sync", None, {"since": "abc"}, {400}),
        ("GET", "/v1/sync", None, {"wait": "nan"}, {400}),
        ("GET", "/v1/sync", None, {"wait": "-1"}, {400}),
        ("GET", "/v1/sync", None, {"limit": "0"}, {400}),
        ("GET", "/v1/sync", None, {"limit": "x"}, {400}),
        ("GET", "/v1/sync", None, {"recent": "-1"}, {400}),
        ("GET", "/v1/sync", None, {"recent": "1.5"}, {400}),
        (
            "POST",
            "/v1/users",
            b'{"username": "\\ud800xx", "password": "password123"}',
            None,
            {400, 422},
        ),
        (
            "POST",
            "/v1/users",
            b'{"username": "nul\\u0000xx", "password": "password123"}',
            None,
            {400, 422},
        ),
        (
            "POST",
            "/v1/sessions",
            b'{"username": "nul\\u0000", "password": "password123"}',
            None,
            {400, 401, 422},
        ),
        (
            "POST",
            "/v1/sessions",
            b'{"username": "\\ud800", "password": "password123"}',
            None,
            {400, 401, 422},
        ),
        (
            "POST",
            "/v1/sessions",
            b'{"username": "x", "password": "pw\\u0000"}',
            None,
            {400, 401, 422},
        ),
        (
            "POST",
            "/v1/friends/requests",
            b'{"to_user_id": 99999999999999999999}',
            None,
            {400, 404, 422},
        ),
        ("POST", "/v1/friends/requests", b'{"to_user_id": 1e400}', None, {400, 422}),
        (
            "POST",
            "/v1/groups",
            b'{"name": "g", "member_ids": [99999999999999999999]}',
            None,
            {400, 404, 422},
        ),
        ("POST", "/v1/groups", b'{"name": "g", "member_ids": [NaN]}', None, {400, 422}),
    ]
    # the session, password and look-up endpoints
    bad_devices = [
        "d" * 65,
        "d" * 10_000,
        "nul%00x",
        "%ED%A0%80",
        "%FF%FE",
        "sp%20ace",
        "%E2%80%AE",
    ]
    cases += [
        ("DELETE", f"/v1/sessions/{d}", None, None, {400, 404, 414, 422}) for d in bad_devices
    ]
    pw = PASSWORD.encode()
    for body in (
        b'{"old_password": "x\u0000y", "new_password": "new-password-1"}',
        b'{"old_password": "\ud800", "new_password": "new-password-1"}',
        b'{"old_password": "' + pw + b'", "new_password": "\udfff\ud800xxxxxxxx"}',
        b'{"old_password": "' + pw + b'", "new_password": "x\u0000xxxxxxxxx"}',
        b'{"old_password": "' + pw + b'", "new_password": "' + b"p" * 100_000 + b'"}',
        b'{"old_password": "' + pw + b'", "new_password": 123456789}',
        b'{"old_password": "' + pw + b'", "new_password": ["new-password-1"]}',
        b'{"old_password": "' + pw + b'", "new_password": null}',
        b'{"old_password": {"a": 1}, "new_password": "new-password-1"}',
        b'{"old_password": 12345678, "new_password": "new-password-1"}',
        b'{"new_password": "new-password-1"}',
        b"[]",
        b"",
    ):
        cases.append(("PUT", "/v1/me/password", body, None, {400, 422}))
    cases.append(
        (
            "PUT",
            "/v1/me/password",
            b'{"old_password": "' + b"p" * 100_000 + b'", "new_password": "new-password-1"}',
            None,
            {400, 401, 422},
        )
    )
    for q in ("x" * 10_000, "a\x00b", "has space", "", "ab", "rtl\u202e"):
        cases.append(("GET", "/v1/users/lookup", None, {"username": q}, {400, 414, 422}))
    for raw in ("%ED%A0%80xx", "%FF%FExx", "a%00b"):  # a surrogate, not UTF-8, NUL
        cases.append(("GET", "/v1/users/lookup?username=" + raw, None, None, {400, 422}))
    cases.append(("GET", "/v1/users/lookup", None, None, {400, 422}))
    # search: a missing, blank or too long q, bad conv_id / limit / before
    for q in ("", " ", "\t\n", "x" * 257, "x" * 10_000):
        cases.append(("GET", "/v1/search", None, {"q": q}, {400, 414}))
    cases.append(("GET", "/v1/search", None, None, {400}))
    for raw in ("a%00b", "%ED%A0%80", "%FF%FE", "g:1%0A", "s:1:2%00"):
        cases.append(("GET", "/v1/search?q=hi&conv_id=" + raw, None, None, {400}))
    for key, value in (
        ("conv_id", ""),
        ("conv_id", "g:" + big),
        ("conv_id", "s:2:1"),
        ("limit", "-1"),
        ("limit", "0"),
        ("limit", big),
        ("limit", "1e3"),
        ("limit", "\x00"),
        ("before", "\x00"),
        ("before", "x" * 10_000),
        ("before", "MTox"),  # "1:1": no conversation
        ("before", "%ED%A0%80"),
    ):
        cases.append(("GET", "/v1/search", None, {"q": "hi", key: value}, {400, 414}))
    # uploads: sizes, types and names a ticket must refuse; ids that name nothing
    for body in (
        b'{"content_type": "text/plain", "size": -1}',
        b'{"content_type": "text/plain", "size": 0.5}',
        b'{"content_type": "text/plain", "size": "10"}',
        b'{"content_type": "text/plain", "size": 1180591620717411303424}',
        b'{"content_type": "text/plain", "size": 9223372036854775808}',
        b'{"content_type": "text/plain", "size": 1e400}',
        b'{"content_type": "text/plain", "size": NaN}',
        b'{"content_type": "", "size": 10}',
        b'{"content_type": "text/plain\\r\\nx-amz-acl: public-read", "size": 10}',
        b'{"content_type": "' + b"x" * 300 + b'/y", "size": 10}',
        b'{"content_type": "text/plain", "size": 10, "filename": "' + b"n" * 10_000 + b'"}',
        b'{"size": 10}',
        b'{"content_type": "text/plain"}',
        b"[]",
    ):
        cases.append(("POST", "/v1/uploads", body, None, {400, 413, 422}))
    for raw in ("%00", "x" * 5000, "%ED%A0%80", "%FF", "..%2F..%2Fx", "00000000-0000-0000-0000"):
        cases.append(("GET", f"/v1/uploads/{raw}", None, None, {400, 404, 414, 422}))
        cases.append(("GET", f"/v1/uploads/{raw}/thumbnail", None, None, {400, 404, 414, 422}))
    # push registrations: platforms, keys and app ids outside their rules
    for body in (
        b'{"app_id": "com.example", "pushkey": "k", "platform": "bogus"}',
        b'{"app_id": "com.example", "pushkey": "", "platform": "apns"}',
        b'{"app_id": "com.example", "pushkey": "' + b"k" * 600 + b'", "platform": "apns"}',
        b'{"app_id": "com.example", "pushkey": "k\u0000", "platform": "fcm"}',
        b'{"app_id": "com.example", "pushkey": "k\n", "platform": "fcm"}',
        b'{"app_id": "", "pushkey": "k", "platform": "apns"}',
        b'{"app_id": "a b", "pushkey": "k", "platform": "apns"}',
        b'{"app_id": "' + b"a" * 65 + b'", "pushkey": "k", "platform": "apns"}',
        b'{"app_id": 1, "pushkey": "k", "platform": "apns"}',
        b'{"pushkey": "k", "platform": "apns"}',
    ):
        cases.append(("PUT", "/v1/push/registration", body, None, {400, 422}))
    # presence: ids that are not ids, too many, too long
    for q in (
        "",
        "abc",
        "1,,2",
        "-1",
        "0",
        "1.5",
        big,
        ",".join(map(str, range(1, 302))),
        "9" * 5000,
        "1;2",
    ):
        cases.append(("GET", "/v1/presence", None, {"user_ids": q}, {400, 414, 422}))
    # profiles by id: not ids
    for raw in ("-1", "0", big, "1.5", "abc", "%00"):
        cases.append(("GET", f"/v1/users/{raw}", None, None, {400, 404, 422}))
    # reactions: what is not one emoji, on a message that does not exist
    for emoji in ("x" * 33, "a%20b", "%00", "%0A", "%ED%A0%80", "%FF"):
        path = f"/v1/conversations/s:1:2/messages/1/reactions/{emoji}"
        cases.append(("PUT", path, None, None, {400, 403, 404}))
    # edits: content that no message may take
    for body in (
        b'{"content": null}',
        b'{"content": "text"}',
        b'{"content": []}',
        b'{"content": {"text": 1180591620717411303424}}',
        b"{}",
    ):
        cases.append(
            ("POST", "/v1/conversations/s:1:2/messages/1/edit", body, None, {400, 403, 404, 422})
        )
    # a mute with an instant that is not one
    for body in (b'{"until": -1}', b'{"until": "soon"}', b'{"until": 1e400}', b"{}"):
        cases.append(("PUT", "/v1/groups/1/members/2/mute", body, None, {400, 403, 404, 422}))
    return cases


@pytest.mark.parametrize(("method", "path", "body", "params", "statuses"), _rest_cases())
async def test_bad_ids_and_queries_are_4xx(
    alice: Client,
    method: str,
    path: str,
    body: bytes | None,
    params: dict[str, str] | None,
    statuses: set[int],
) -> None:
    resp = await rest(alice.base_url, method, path, token=alice.token, body=body, params=params)
    assert resp.status_code in statuses, (
        method,
        path,
        params,
        body,
        resp.status_code,
        resp.text[:300],
    )
    check_error_body(resp, (method, path))


@pytest.mark.parametrize(
    "q",
    [
        "a\x00b",
        "\x00",
        "\u202e rtl",
        "'; DROP TABLE messages; --",
        "\\",
        "a:*",
        "a & b | !c",
        "<-> <2> ((",
        "'",
        "x" * 256,
        "世" * 256,
        "👍🏽",
        "\U0010ffff",
        "a" * 200 + " " + "b",
        "\ufffd",
    ],
)
async def test_hostile_search_text_is_searched_not_interpreted(alice: Client, q: str) -> None:
    """Whatever a query holds, it becomes tokens (or nothing): 200 and a page."""
    resp = await rest(alice.base_url, "GET", "/v1/search", token=alice.token, params={"q": q})
    assert resp.status_code == 200, (q, resp.status_code, resp.text[:300])
    assert resp.json() == {"results": [], "next_before": None}  # alice sent nothing


@pytest.mark.parametrize("raw", ["%ED%A0%80xx", "%FF%FExx", "a%00b", "%E2%80%AE"])
async def test_search_q_not_utf8_is_not_5xx(alice: Client, raw: str) -> None:
    resp = await rest(alice.base_url, "GET", "/v1/search?q=" + raw, token=alice.token)
    assert resp.status_code in (200, 400), (raw, resp.status_code, resp.text[:300])
    if resp.status_code == 200:
        assert resp.json() == {"results": [], "next_before": None}
    else:
        check_error_body(resp, raw)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("display_name", "a\x00b"),
        ("display_name", "\ud800"),
        ("note", "a\x00b"),
        ("note", "\udfff"),
        ("name", "a\x00b"),
        ("name", "x\ud800"),
    ],
)
async def test_text_the_database_cannot_store_is_4xx(
    url: str, alice: Client, bob: Client, field: str, value: str
) -> None:
    """NUL and lone surrogates are valid in JSON (as escapes) but not in a PostgreSQL text
    column: a clear 400, not a 500."""
    body: dict[str, Any]
    if field == "display_name":
        path, body = (
            "/v1/users",
            {"username": f"u{uuid.uuid4().hex[:10]}", "password": PASSWORD, field: value},
        )
        token = None
    elif field == "note":
        path, body, token = (
            "/v1/friends/requests",
            {"to_user_id": bob.user_id, field: value},
            alice.token,
        )
    else:
        path, body, token = "/v1/groups", {"name": value, "member_ids": []}, alice.token
    resp = await rest(url, "POST", path, token=token, body=json.dumps(body).encode())
    assert resp.status_code in (400, 422), (path, body, resp.status_code, resp.text[:300])
    check_error_body(resp, (path, body))
    # and it changed nothing
    assert (await bob.friend_requests())["incoming"] == []
    assert await alice.conversations() == []


# --------------------------------------------------------------------------------------
# 4. size limits on every field


def _name(n: int) -> str:
    return ("u" + uuid.uuid4().hex * 4)[:n]


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ({"username": _name(32), "password": PASSWORD}, True),
        ({"username": _name(33), "password": PASSWORD}, False),
        ({"username": _name(10), "password": "p" * 256}, True),
        ({"username": _name(10), "password": "p" * 257}, False),
        ({"username": _name(10), "password": PASSWORD, "display_name": "d" * 64}, True),
        ({"username": _name(10), "password": PASSWORD, "display_name": "d" * 65}, False),
        ({"username": _name(10), "password": PASSWORD, "display_name": "é" * 65}, False),
        ({"username": _name(10), "password": "p" * 100_000}, False),
    ],
    ids=["user32", "user33", "pw256", "pw257", "dn64", "dn65", "dn65-unicode", "pw100k"],
)
async def test_account_field_limits(url: str, body: dict[str, Any], ok: bool) -> None:
    body = {**body, "username": body["username"][:-6] + uuid.uuid4().hex[:6]}
    resp = await rest(url, "POST", "/v1/users", body=json.dumps(body).encode())
    if ok:
        assert resp.status_code == 201, resp.text
    else:
        assert resp.status_code in (400, 422), (resp.status_code, resp.text[:200])
        check_error_body(resp, body)
        login = await rest(
            url,
            "POST",
            "/v1/sessions",
            body=json.dumps({"username": body["username"], "password": body["password"]}).encode(),
        )
        assert login.status_code == 401, "a refused registration must not create the user"
        check_error_body(login, "login")


async def test_login_password_over_limit_is_refused(url: str, alice: Client) -> None:
    body = {"username": alice.username, "password": "p" * 257}
    resp = await rest(url, "POST", "/v1/sessions", body=json.dumps(body).encode())
    assert resp.status_code in (400, 401, 422), resp.text
    check_error_body(resp, body)


async def test_friend_note_limit(alice: Client, bob: Client, url: str) -> None:
    too_long = {"to_user_id": bob.user_id, "note": "n" * 257}
    resp = await rest(
        url, "POST", "/v1/friends/requests", token=alice.token, body=json.dumps(too_long).encode()
    )
    assert resp.status_code in (400, 422), resp.text
    check_error_body(resp, too_long)
    assert (await bob.friend_requests())["incoming"] == []
    assert bob.user_id is not None
    rid = await alice.request_friend(bob.user_id, note="n" * 256)
    incoming = (await bob.friend_requests())["incoming"]
    assert [(r["request_id"], len(r["note"])) for r in incoming] == [(rid, 256)]


async def test_group_name_and_member_count_limits(alice: Client, bob: Client, url: str) -> None:
    assert bob.user_id is not None and alice.user_id is not None
    body: dict[str, Any]
    for body in (
        {"name": "g" * 65, "member_ids": []},
        {"name": "", "member_ids": []},
        {"name": "g", "member_ids": list(range(1, 5002))},
        {"name": "g", "member_ids": [bob.user_id] * 5001},
    ):
        resp = await rest(
            url, "POST", "/v1/groups", token=alice.token, body=json.dumps(body).encode()
        )
        assert resp.status_code in (400, 422), (str(body)[:80], resp.status_code, resp.text[:200])
        check_error_body(resp, str(body)[:80])
    assert await alice.conversations() == [], "a refused group must not exist"
    g = await alice.create_group("g" * 64, [bob.user_id])
    body = {"user_ids": list(range(1, 5002)), "with_history": False}
    resp = await rest(
        url,
        "POST",
        f"/v1/groups/{g['group_id']}/members",
        token=alice.token,
        body=json.dumps(body).encode(),
    )
    assert resp.status_code in (400, 422), (resp.status_code, resp.text[:200])
    check_error_body(resp, "add 5001")
    members = await alice.members(g["group_id"])
    assert sorted(m["user_id"] for m in members) == sorted([alice.user_id, bob.user_id])


async def test_send_field_limits(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    conn = await alice.connect()
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"client_msg_id": "c" * 64, "content": {"text": "x"}}, None),
        ({"client_msg_id": "c" * 65, "content": {"text": "x"}}, "bad_request"),
        ({"content_type": "t" * 32, "content": {"v": 1}}, None),
        ({"content_type": "t" * 33, "content": {"v": 1}}, "bad_request"),
        ({"content": {"text": "x" * (16 * 1024 - 11)}}, None),  # exactly 16 KiB encoded
        ({"content": {"text": "x" * (16 * 1024 - 10)}}, "too_large"),
        ({"content": {"text": "é" * 9000}}, "too_large"),  # 18 000 bytes, 9 000 chars
    ]
    ok_seqs = []
    for over in ("ws", "rest"):
        for extra, code in cases:
            body = {"client_msg_id": uuid.uuid4().hex, "content_type": "text", **extra}
            if over == "rest" and "client_msg_id" in extra:
                body["client_msg_id"] = body["client_msg_id"][:-3] + "rst"
            if over == "ws":
                await conn.send_raw(
                    orjson.dumps({"type": "send", "conv_id": conv, **body}).decode()
                )
                ack = await conn.next_event("ack", timeout=5)
                if code is None:
                    assert ack["ok"] is True, (extra.keys(), ack)
                    ok_seqs.append(ack["seq"])
                else:
                    assert ack["ok"] is False and ack["code"] == code, (str(extra)[:80], ack)
            else:
                resp = await rest(
                    alice.base_url,
                    "POST",
                    c_path(conv) + "/messages",
                    token=alice.token,
                    body=orjson.dumps(body),
                )
                if code is None:
                    assert resp.status_code == 200, resp.text[:200]
                    ok_seqs.append(resp.json()["seq"])
                else:
                    want = 413 if code == "too_large" else 400
                    assert resp.status_code == want, (
                        str(extra)[:80],
                        resp.status_code,
                        resp.text[:200],
                    )
                    assert check_error_body(resp, extra)["code"] == code
    assert ok_seqs == list(range(1, len(ok_seqs) + 1)), "refused sends must take no seq"
    await conn.ping()
    msgs = await eventually(lambda: _history_len(bob, conv, len(ok_seqs)))
    assert [m["seq"] for m in msgs] == ok_seqs
    await conn.close()


MENTION_CASES: list[tuple[dict[str, Any], str | None]] = [
    ({"mentions": list(range(1, 5_001))}, "bad_request"),  # far over the bound
    ({"mentions": [7] * 101}, "bad_request"),  # duplicates count against it
    ({"mentions": [-1]}, "bad_request"),
    ({"mentions": [0]}, "bad_request"),
    ({"mentions": [True]}, "bad_request"),
    ({"mentions": [1.0]}, "bad_request"),
    ({"mentions": ["1"]}, "bad_request"),
    ({"mentions": [2**63]}, "bad_request"),
    ({"mentions": [[1]]}, "bad_request"),
    ({"mentions": None}, "bad_request"),
    ({"mentions": {"1": 1}}, "bad_request"),
    ({"mention_all": 1}, "bad_request"),
    ({"mention_all": None}, "bad_request"),
    ({"reply_to": -1}, "bad_request"),
    ({"reply_to": 0}, "bad_request"),
    ({"reply_to": True}, "bad_request"),
    ({"reply_to": 2**63}, "bad_request"),
    ({"reply_to": 2**64 + 1}, "bad_request"),
    ({"reply_to": 2**63 - 1}, "bad_request"),  # well formed, never handed out
    ({"mentions": [2**63 - 1] * 100, "reply_to": None}, None),  # dropped: no such member
    ({"mentions": [], "mention_all": False}, None),
]


async def test_mention_and_reply_fields_hostile_values(alice: Client, bob: Client) -> None:
    """Every bad mentions / mention_all / reply_to value is a clear 400 (a refused ack on
    the WebSocket) that takes no seq; well-formed ids of nobody are dropped silently."""
    g = await alice.create_group("hostile", [bob.user_id])
    conv = g["conv_id"]
    conn = await alice.connect()
    ok_seqs = []
    for over in ("ws", "rest"):
        for extra, code in MENTION_CASES:
            body = {
                "client_msg_id": uuid.uuid4().hex,
                "content_type": "text",
                "content": {"text": "x"},
                **extra,
            }
            if over == "ws":
                await conn.send_raw(json.dumps({"type": "send", "conv_id": conv, **body}))
                ack = await conn.next_event("ack", timeout=5)
                if code is None:
                    assert ack["ok"] is True, (str(extra)[:80], ack)
                    ok_seqs.append(ack["seq"])
                else:
                    assert ack["ok"] is False and ack["code"] == code, (str(extra)[:80], ack)
            else:
                resp = await rest(
                    alice.base_url,
                    "POST",
                    c_path(conv) + "/messages",
                    token=alice.token,
                    body=json.dumps(body).encode(),  # stdlib json: integers of any size
                )
                if code is None:
                    assert resp.status_code == 200, resp.text[:200]
                    ok_seqs.append(resp.json()["seq"])
                else:
                    assert resp.status_code == 400, (str(extra)[:80], resp.text[:200])
                    assert check_error_body(resp, extra)["code"] == code
    assert ok_seqs == list(range(1, len(ok_seqs) + 1)), "refused sends must take no seq"
    msgs = await eventually(lambda: _history_len(bob, conv, len(ok_seqs)))
    assert all(m["mentions"] == [] and m["mention_all"] is False for m in msgs), msgs
    await conn.close()


async def _history_len(c: Client, conv: str, n: int) -> list[dict[str, Any]] | None:
    msgs = (await c.history(conv, limit=200))["messages"]
    return msgs if len(msgs) >= n else None


async def test_frame_size_limit_closes_1009_and_nothing_below_it_does(
    pair: tuple[Client, Client, str],
) -> None:
    alice, _, conv = pair
    conn = await alice.connect()
    limit = 64 * 1024
    # just under and at the limit: answered (these are not valid frames), socket open
    for size in (limit - 1, limit):
        await conn.send_raw("x" * size)
        ev = await conn.next_event("error", timeout=5)
        assert ev["code"] == "bad_request"
        pad = "p" * (size - len(json.dumps({"type": "ping", "pad": ""})))
        await conn.send_raw(json.dumps({"type": "ping", "pad": pad}))
        await conn.ping()
        await conn.send_raw(b"\xff" * size, text=False)
        ev = await conn.next_event("error", timeout=5)
        assert ev["code"] == "bad_request"
        await conn.ping()
    # a send frame near the limit, with content over the content limit: too_large, open
    big = {
        "type": "send",
        "conv_id": conv,
        "client_msg_id": "big-1",
        "content": {"text": "y" * 60_000},
    }
    await conn.send_raw(json.dumps(big))
    ack = await conn.next_event("ack", timeout=5)
    assert ack["ok"] is False and ack["code"] == "too_large"
    await conn.ping()
    assert not conn.closed.is_set()
    # one byte over (text, then binary, then multi-byte text): 1009
    for frame in ("x" * (limit + 1), b"\x00" * (limit + 1), "é" * (limit // 2 + 1)):
        c = await alice.connect()
        await c.ping()
        await c.send_raw(frame, text=isinstance(frame, str))
        assert await c.wait_closed(5) == 1009, type(frame)
    await conn.ping()  # the other socket of the same user is unaffected
    await conn.close()


# --------------------------------------------------------------------------------------
# NUL inside message content: its own stores, so a stuck entry cannot leak into the suite


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    stores = Stores.start(tmp_path / "stores")
    srv = ServerProcess(env=stores.env()).start()
    try:
        yield srv
    finally:
        srv.terminate()
        stores.stop()


async def test_nul_in_content_is_refused_or_persisted(own_server: ServerProcess) -> None:
    """``{"text": "a\\u0000b"}`` is valid JSON. Either the send is refused (bad_request),
    or it is acked and then, like every acked message, reaches PostgreSQL, and so do the
    messages acked alongside it."""
    url = own_server.url
    alice, bob = await new_user(url, "alice"), await new_user(url, "bob")
    conv = await befriend(alice, bob)
    conn = await alice.connect()
    futs = [await conn.send_nowait(conv, f"before-{i}") for i in range(3)]
    futs.append(await conn.send_nowait(conv, {"text": "a\x00b", "k\x00": 1}))
    futs += [await conn.send_nowait(conv, f"after-{i}") for i in range(3)]
    acks = await asyncio.gather(*futs)
    nul_ack = acks[3]
    if not nul_ack["ok"]:
        assert nul_ack["code"] == "bad_request", nul_ack
    acked = sorted(a["seq"] for a in acks if a["ok"])
    assert acked == list(range(1, len(acked) + 1))
    try:
        msgs = await eventually(lambda: _history_len(bob, conv, len(acked)), timeout=6)
    except AssertionError:
        got = (await bob.history(conv, limit=200))["messages"]
        raise AssertionError(
            f"acked seqs {acked}, persisted {[m['seq'] for m in got]}; NUL ack {nul_ack};\n"
            f"server log:\n{own_server.log_tail(15)}"
        ) from None
    assert [m["seq"] for m in msgs] == acked
    if nul_ack["ok"]:
        stored = next(m for m in msgs if m["seq"] == nul_ack["seq"])
        assert stored["content"] == {"text": "a\x00b", "k\x00": 1}
    await conn.close()
    await alice.aclose()
    await bob.aclose()


# --------------------------------------------------------------------------------------
# strict numbers: JSON without NaN/Infinity, integers in ASCII digits only


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_in_bodies_are_refused_and_store_nothing(
    pair: tuple[Client, Client, str], literal: str
) -> None:
    alice, bob, conv = pair
    first = await alice.send_rest(conv, "first")
    bodies = [
        (
            "/messages",
            f'{{"client_msg_id": "nan-{literal}", "content_type": "text", '
            f'"content": {{"text": "x", "n": {literal}}}}}',
        ),
        ("/read", f'{{"seq": {literal}}}'),
    ]
    for suffix, body in bodies:
        resp = await rest(
            alice.base_url, "POST", c_path(conv) + suffix, token=alice.token, body=body.encode()
        )
        assert resp.status_code in (400, 422), (body, resp.status_code, resp.text[:200])
        check_error_body(resp, body)
    resp = await rest(
        alice.base_url,
        "POST",
        "/v1/groups",
        token=alice.token,
        body=f'{{"name": "g", "member_ids": [], "x": {literal}}}'.encode(),
    )
    assert resp.status_code in (400, 422), resp.text[:200]
    # nothing was stored: the next send takes the very next seq
    assert await send_ok(alice, conv, "next") == first["seq"] + 1


@pytest.mark.parametrize("literal", [str(2**70), str(2**64), str(-(2**63) - 1), "9" * 300])
async def test_integers_past_64_bits_are_refused_and_store_nothing(
    pair: tuple[Client, Client, str], literal: str
) -> None:
    """Integers anywhere in a request fit in 64 bits: a larger one is refused,
    on REST and on the WebSocket, message content included, and never stored rounded to
    a float. A float literal of any size stays a float."""
    alice, bob, conv = pair
    first = await alice.send_rest(conv, "first")
    rest_bodies = [
        (
            c_path(conv) + "/messages",
            f'{{"client_msg_id": "big-{uuid.uuid4().hex[:8]}", "content_type": "text", '
            f'"content": {{"text": "x", "n": [{literal}]}}}}',
        ),
        (c_path(conv) + "/read", f'{{"seq": {literal}}}'),
        ("/v1/friends/requests", f'{{"to_user_id": {literal}}}'),
        ("/v1/groups", f'{{"name": "g", "member_ids": [], "x": {literal}}}'),
    ]
    for path, body in rest_bodies:
        resp = await rest(alice.base_url, "POST", path, token=alice.token, body=body.encode())
        assert resp.status_code == 400, (body, resp.status_code, resp.text[:200])
        assert check_error_body(resp, body)["code"] == "bad_request"
    conn = await alice.connect()
    try:
        cmid = f"bigws-{uuid.uuid4().hex[:8]}"
        await conn.send_raw(
            f'{{"type": "send", "client_msg_id": "{cmid}", "conv_id": "{conv}", '
            f'"content_type": "text", "content": {{"text": "x", "n": {literal}}}}}'
        )
        ack = await conn.next_event("ack", predicate=lambda f: f.get("client_msg_id") == cmid)
        assert ack["ok"] is False and ack["code"] == "bad_request", ack
        await conn.send_raw(f'{{"type": "read", "conv_id": "{conv}", "seq": {literal}}}')
        err = await conn.next_event("error")
        assert err["code"] == "bad_request" and "64 bits" in err["message"], err
        await conn.ping()
    finally:
        await conn.close()
    # nothing was stored: the next send takes the very next seq; a big float is fine
    ack = await alice.send_rest(conv, {"text": "float", "n": 1e30, "m": 9.5e18})
    assert ack["ok"] and ack["seq"] == first["seq"] + 1, ack
    await persisted(alice, conv, ack["seq"])
    stored = (await bob.history(conv, begin=ack["seq"], end=ack["seq"]))["messages"][0]
    assert stored["content"] == {"text": "float", "n": 1e30, "m": 9.5e18}, stored


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/conversations/{conv}/messages", {"begin": "1_0"}),
        ("/v1/conversations/{conv}/messages", {"limit": "\uff11\uff10"}),  # full-width 10
        ("/v1/conversations/{conv}/messages", {"end": "+5"}),
        ("/v1/conversations/{conv}/messages", {"end": " 5"}),
        ("/v1/sync", {"since": "1_0"}),
        ("/v1/sync", {"limit": "\uff15"}),
        ("/v1/sync", {"wait": "1e1"}),
        ("/v1/sync", {"wait": "inf"}),
        ("/v1/conversations/{conv}/messages/1_0/receipts", None),
        ("/v1/conversations/{conv}/messages/\uff11/receipts", None),
        ("/v1/users/1_0", None),
        ("/v1/users/+1", None),
        ("/v1/users/\uff11", None),
    ],
)
async def test_integers_are_ascii_digits_only(
    pair: tuple[Client, Client, str], path: str, params: dict[str, str] | None
) -> None:
    alice, _, conv = pair
    resp = await rest(
        alice.base_url,
        "GET",
        path.format(conv=quote(conv, safe=":")),
        token=alice.token,
        params=params,
    )
    assert resp.status_code in (400, 422), (path, params, resp.status_code, resp.text[:200])
    check_error_body(resp, (path, params))


async def test_recall_of_a_seq_never_handed_out_is_404_at_once(
    pair: tuple[Client, Client, str],
) -> None:
    alice, _, conv = pair
    seq = await send_ok(alice, conv, "mine")
    for far in (seq + 1, seq + 5_000, 2**62):
        t0 = time.monotonic()
        with pytest.raises(ApiError) as e:
            await alice.recall(conv, far)
        assert (e.value.status, e.value.code) == (404, "not_found")
        assert time.monotonic() - t0 < 0.5, (far, time.monotonic() - t0)
    assert (await alice.recall(conv, seq))["seq"] == seq


# --------------------------------------------------------------------------------------
# edits and reactions: bad frames, bodies and emoji paths are refused and change nothing


BAD_EDIT_FRAMES: list[dict[str, Any]] = [
    {"seq": True},
    {"seq": False},
    {"seq": -1},
    {"seq": 1.0},
    {"seq": "1"},
    {"seq": None},
    {"seq": 2**63},
    {"seq": [1]},
    {"content": "x"},
    {"content": None},
    {"content": []},
    {"content": True},
    {"conv_id": "s:2:1"},
    {"conv_id": 5},
    {"conv_id": None},
]


async def test_bad_edit_frames_are_refused_and_change_nothing(
    pair: tuple[Client, Client, str],
) -> None:
    alice, _bob, conv = pair
    seq = await send_ok(alice, conv, "as sent")
    conn = await alice.connect()
    try:
        good = {"type": "edit", "conv_id": conv, "seq": seq, "content": {"text": "edited"}}
        for bad in BAD_EDIT_FRAMES:
            await conn.send_raw(orjson.dumps({**good, **bad}).decode())
            ev = await conn.next_event("error", timeout=5)
            assert ev["code"] == "bad_request" and ev["message"], (bad, ev)
        for missing in ("conv_id", "seq", "content"):
            frame = {k: v for k, v in good.items() if k != missing}
            await conn.send_raw(orjson.dumps(frame).decode())
            ev = await conn.next_event("error", timeout=5)
            assert ev["code"] == "bad_request" and missing in ev["message"], (missing, ev)
        for content, code in (({"text": ""}, "bad_request"), ({"text": "x" * 20_000}, "too_large")):
            err = await conn.edit(conv, seq, content)
            assert err["type"] == "error" and err["code"] == code, err
        await conn.ping(timeout=5)
        assert not conn.closed.is_set()
    finally:
        await conn.close()
    page = await alice.history(conv)
    assert page["max_seq"] == seq, page
    assert page["messages"][-1]["content"] == {"text": "as sent"}
    assert page["messages"][-1]["edited_at"] is None


def _bad_reaction_paths(conv: str, seq: int) -> list[tuple[str, set[int]]]:
    base = f"/v1/conversations/{conv}/messages"
    out: list[tuple[str, set[int]]] = []
    for emoji in (
        "x" * 33,
        "%20",
        "a%20b",
        "%09",
        "%0A",
        "%00",
        "%7F",
        "%E2%80%A8",
        "%E3%80%80",
        "%ED%A0%80",  # a surrogate
        "%FF%FE",  # not UTF-8
        "%EF%BF%BD",  # U+FFFD itself
    ):
        out.append((f"{base}/{seq}/reactions/{emoji}", {400}))
    out.append((f"{base}/{seq}/reactions/", {400, 404, 405}))
    for bad_seq in ("true", "-1", "1.0", "0x1", "99999999999999999999", "%F0%9F%91%8D"):
        out.append((f"{base}/{bad_seq}/reactions/%F0%9F%91%8D", {400, 404}))
    return out


async def test_bad_reactions_and_edit_bodies_are_4xx_and_change_nothing(
    pair: tuple[Client, Client, str],
) -> None:
    alice, bob, conv = pair
    seq = await send_ok(alice, conv, "react here")
    for path, statuses in _bad_reaction_paths(conv, seq):
        for method in ("PUT", "DELETE"):
            resp = await rest(alice.base_url, method, path, token=bob.token)
            assert resp.status_code in statuses, (method, path, resp.status_code, resp.text)
            check_error_body(resp, (method, path))
    edit = f"/v1/conversations/{conv}/messages/{seq}/edit"
    for body in (
        b'{"content": "x"}',
        b'{"content": null}',
        b'{"content": [1]}',
        b'{"content": true}',
        b'{"content": {"text": true}}',
        b'{"content": {"text": ""}}',
        b'{"content": {"text": NaN}}',
        b"{}",
        b"[]",
        b"null",
    ):
        resp = await rest(alice.base_url, "POST", edit, token=alice.token, body=body)
        assert resp.status_code in (400, 422), (body, resp.status_code, resp.text)
        check_error_body(resp, body)
    for bad_seq in ("true", "-1", "0", "1.5", "99999999999999999999"):
        path = f"/v1/conversations/{conv}/messages/{bad_seq}/edit"
        resp = await rest(alice.base_url, "POST", path, token=alice.token, body=b'{"content":{}}')
        assert resp.status_code in (400, 404), (bad_seq, resp.status_code, resp.text)
        check_error_body(resp, path)
    page = await alice.history(conv)
    assert page["max_seq"] == seq, page  # no notice of any kind
    last = page["messages"][-1]
    assert last["content"] == {"text": "react here"} and last["edited_at"] is None, last
    assert last["reactions"] == [], last
