"""The JSON Schema (draft 2020-12) of every WebSocket frame, generated from the frame
models, so it cannot drift from what the server accepts and sends.

Top level: ``anyOf`` of ``$defs.client_frame`` and ``$defs.server_frame``; each of those
is a ``oneOf`` whose members are told apart by ``type`` (and the two ``ack`` frames by
``ok``). pydantic's OpenAPI ``discriminator`` hints are left out: they are not JSON
Schema, and a nested one (``ack``) has no valid OpenAPI form either."""

from __future__ import annotations

import functools
from typing import Literal, TypeVar

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaValue

from im_server.protocol.client_frames import CLIENT_FRAME
from im_server.protocol.server_frames import SERVER_FRAME

DIALECT = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/{model}"
T = TypeVar("T")


def _drop_discriminators(node: object) -> None:
    if isinstance(node, dict):
        node.pop("discriminator", None)
        for v in node.values():
            _drop_discriminators(v)
    elif isinstance(node, list):
        for v in node:
            _drop_discriminators(v)


def _flat_one_of(schema: JsonSchemaValue) -> list[JsonSchemaValue]:
    """The members of a ``oneOf``, with a nested bare ``oneOf`` (the two acks) lifted."""
    out: list[JsonSchemaValue] = []
    for member in schema["oneOf"]:
        if set(member) == {"oneOf"}:
            out.extend(_flat_one_of(member))
        else:
            out.append(member)
    return out


def _direction(
    adapter: TypeAdapter[T], mode: Literal["validation", "serialization"]
) -> tuple[JsonSchemaValue, dict[str, JsonSchemaValue]]:
    schema = adapter.json_schema(ref_template=REF, mode=mode)
    _drop_discriminators(schema)
    defs: dict[str, JsonSchemaValue] = schema.pop("$defs", {})
    return {"oneOf": _flat_one_of(schema)}, defs


@functools.cache
def ws_schema() -> JsonSchemaValue:
    """The schema document (built once per process; callers must not modify it)."""
    client, client_defs = _direction(CLIENT_FRAME, "validation")
    server, server_defs = _direction(SERVER_FRAME, "serialization")
    for name in client_defs.keys() & server_defs.keys():
        if client_defs[name] != server_defs[name]:
            raise RuntimeError(f"frame model name {name!r} means two things")
    client["description"] = "A frame a client sends. Unknown fields are ignored."
    server["description"] = "A frame the server sends. Clients should ignore unknown types."
    return {
        "$schema": DIALECT,
        "title": "im-server WebSocket frames",
        "description": "Every frame a client may send and every frame the server may send, "
        "one JSON object per text frame.",
        "anyOf": [{"$ref": "#/$defs/client_frame"}, {"$ref": "#/$defs/server_frame"}],
        "$defs": {
            **client_defs,
            **server_defs,
            "client_frame": client,
            "server_frame": server,
        },
    }
