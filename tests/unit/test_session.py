"""The sans-I/O WebSocket session, driven without sockets: frames in, commands out;
results in, frames out (as ``test_client_pure.py`` drives the client's ``SyncState``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from im_server.errors import ImError
from im_server.protocol.close_codes import CloseCode
from im_server.protocol.server_frames import SERVER_FRAME, ack, edited
from im_server.protocol.session import (
    Close,
    CursorCmd,
    EditCmd,
    Reply,
    SendCmd,
    Session,
    SessionClosed,
    State,
    TypingCmd,
)
from im_server.protocol.types import conv_ref


@pytest.fixture
def session() -> Session:
    return Session(1, "phone", max_frame_bytes=1024)


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def answer(reply: object) -> dict[str, Any]:
    """A reply's frame, checked against the server frame models."""
    assert isinstance(reply, Reply)
    out: dict[str, Any] = json.loads(reply.text)
    assert SERVER_FRAME.validate_python(out) == out
    return out


def test_send_becomes_a_send_command(session: Session) -> None:
    cmd = session.receive(
        frame(type="send", conv_id="s:1:2", client_msg_id="a-1", content={"text": "hi"})
    )
    assert cmd == SendCmd(conv_ref("s:1:2"), "a-1", "text", {"text": "hi"})
    assert isinstance(cmd, SendCmd) and cmd.conv.kind == "single" and cmd.conv.b == 2


@pytest.mark.parametrize("kind", ["read", "delivered"])
def test_cursor_reports(session: Session, kind: str) -> None:
    cmd = session.receive(frame(type=kind, conv_id="g:7", seq=2**63 + 5))
    assert cmd == CursorCmd(kind, conv_ref("g:7"), 2**63 - 1)  # type: ignore[arg-type]


def test_edit_becomes_an_edit_command(session: Session) -> None:
    cmd = session.receive(frame(type="edit", conv_id="g:7", seq=3, content={"text": "fixed"}))
    assert cmd == EditCmd(conv_ref("g:7"), 3, {"text": "fixed"})
    answer_ = json.loads(session.edited(edited("g:7", 3, 9, 1764412345678)))
    assert SERVER_FRAME.validate_python(answer_) == answer_
    assert answer_ == {
        "type": "edited",
        "conv_id": "g:7",
        "seq": 3,
        "edit_seq": 9,
        "edited_at": 1764412345678,
    }


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"conv_id": "g:7", "seq": True, "content": {"text": "x"}}, "seq must be"),
        ({"conv_id": "g:7", "seq": -1, "content": {"text": "x"}}, "seq must be"),
        ({"conv_id": "g:7", "seq": 2**63, "content": {"text": "x"}}, "seq must be"),
        ({"conv_id": "g:7", "seq": "3", "content": {"text": "x"}}, "seq must be"),
        ({"conv_id": "g:7", "seq": 3, "content": "x"}, "content must be a JSON object"),
        ({"conv_id": "g:7", "seq": 3}, "content is required"),
        ({"conv_id": "s:2:1", "seq": 3, "content": {}}, "conv_id must be"),
    ],
)
def test_a_bad_edit_is_answered_with_an_error(
    session: Session, fields: dict[str, Any], says: str
) -> None:
    out = answer(session.receive(frame(type="edit", **fields)))
    assert out["type"] == "error" and out["code"] == "bad_request", out
    assert out["message"].startswith(says), out


def test_typing(session: Session) -> None:
    assert session.receive(frame(type="typing", conv_id="g:7")) == TypingCmd(conv_ref("g:7"))


def test_ping_is_answered_at_once(session: Session) -> None:
    cmd = session.receive(b'{"type": "ping"}')
    assert answer(cmd) == {"type": "pong"}
    assert isinstance(cmd, Reply) and cmd.refused is None


def test_a_bad_frame_is_answered_with_an_error_and_the_session_goes_on(session: Session) -> None:
    cmd = session.receive("not json")
    assert answer(cmd) == {
        "type": "error",
        "code": "bad_request",
        "message": "a frame must be one JSON object",
    }
    assert isinstance(cmd, Reply) and cmd.refused == "bad_request" and not cmd.of_send
    assert session.state is State.OPEN
    bad_read = session.receive(frame(type="read", conv_id="g:7", seq=True))
    assert answer(bad_read)["message"] == "seq must be a non-negative integer"
    assert session.receive(frame(type="ping")) == Reply('{"type":"pong"}')


def test_a_bad_send_is_answered_with_a_refused_ack_echoing_the_id(session: Session) -> None:
    cmd = session.receive(frame(type="send", conv_id="s:2:1", client_msg_id="a-2", content={}))
    assert answer(cmd) == {
        "type": "ack",
        "client_msg_id": "a-2",
        "ok": False,
        "code": "bad_request",
        "message": "conv_id must be 's:<a>:<b>' with a < b or 'g:<group_id>'",
    }
    assert isinstance(cmd, Reply) and cmd.of_send and cmd.refused == "bad_request"
    no_id = session.receive(frame(type="send", client_msg_id=["x"], conv_id="g:1"))
    assert answer(no_id)["client_msg_id"] is None


def test_an_oversize_frame_closes_with_1009(session: Session) -> None:
    head, tail = '{"type": "typing", "conv_id": "g:7", "pad": "', '"}'
    ok = head + "x" * (1024 - len(head) - len(tail)) + tail
    assert len(ok) == 1024 and isinstance(session.receive(ok), TypingCmd)
    cmd = session.receive(ok[:-2] + 'x"}')
    assert cmd == Close(CloseCode.TOO_BIG, "frame too large")
    assert session.state is State.CLOSED
    with pytest.raises(SessionClosed):
        session.receive(frame(type="ping"))


def test_binary_frames_are_limited_by_bytes() -> None:
    session = Session(1, "d", max_frame_bytes=20)
    assert isinstance(session.receive(b'{"type":   "ping"}'), Reply)
    assert isinstance(session.receive(b" " * 21), Close)


def test_close_on_request(session: Session) -> None:
    assert session.close(CloseCode.INTERNAL_ERROR, "internal error") == Close(
        CloseCode.INTERNAL_ERROR, "internal error"
    )
    assert session.state is State.CLOSED


def test_results_become_frames(session: Session) -> None:
    ok = json.loads(session.acked(ack("s:1:2", "a-1", 9, 1764412345678, True)))
    assert ok == {
        "type": "ack",
        "client_msg_id": "a-1",
        "ok": True,
        "conv_id": "s:1:2",
        "seq": 9,
        "server_time": 1764412345678,
        "duplicate": True,
    }
    refused = json.loads(session.refused("a-1", ImError("blocked", "the receiver blocked you")))
    assert (refused["ok"], refused["code"], refused["client_msg_id"]) == (False, "blocked", "a-1")
    failed = json.loads(session.failed(ImError("not_member", "not yours")))
    assert failed == {"type": "error", "code": "not_member", "message": "not yours"}
    for text in (json.dumps(ok), json.dumps(refused), json.dumps(failed)):
        SERVER_FRAME.validate_json(text)


def test_many_frames_one_session(session: Session) -> None:
    """A session is a plain object: one per connection, any number of frames."""
    cmds = [
        session.receive(
            frame(type="send", conv_id="g:7", client_msg_id=f"m{i}", content={"text": str(i)})
        )
        for i in range(100)
    ]
    assert [c.client_msg_id for c in cmds if isinstance(c, SendCmd)] == [
        f"m{i}" for i in range(100)
    ]
