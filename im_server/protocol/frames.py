"""Client frames, sans I/O: text in, a checked (type, fields) out, or an ImError whose
code goes back to the client as an ``error`` frame. No sockets here."""

from __future__ import annotations

from typing import Any

import orjson

from im_server.errors import ImError, bad_request

CLIENT_TYPES = frozenset({"send", "read", "delivered", "typing", "ping"})


def parse(text: str | bytes) -> dict[str, Any]:
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise bad_request("a frame must be one JSON object") from None
    if not isinstance(frame, dict):
        raise bad_request("a frame must be one JSON object")
    ftype = frame.get("type")
    if not isinstance(ftype, str):
        raise bad_request("a frame needs a string 'type'")
    if ftype not in CLIENT_TYPES:
        raise bad_request(f"unknown frame type {ftype[:32]!r}")
    return frame


def seq_field(frame: dict[str, Any], name: str = "seq") -> int:
    v = frame.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**63 - 1:
        raise bad_request(f"{name} must be a non-negative 64-bit integer")
    return v


def error_frame(err: ImError) -> str:
    return orjson.dumps({"type": "error", "code": err.code, "message": err.message}).decode()


def refused_ack(client_msg_id: Any, err: ImError) -> str:
    cmid = client_msg_id if isinstance(client_msg_id, str) and len(client_msg_id) <= 128 else None
    return orjson.dumps(
        {
            "type": "ack",
            "client_msg_id": cmid,
            "ok": False,
            "code": err.code,
            "message": err.message,
        }
    ).decode()


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


PONG = '{"type":"pong"}'
