"""GET /v1/protocol/ws-schema: the JSON Schema of every WebSocket frame, generated from
the frame models (``protocol/schema.py``). Public, like the OpenAPI document: it is the
same for every caller, so it is built once per process and clients may cache it."""

from __future__ import annotations

import functools

import orjson
from fastapi import APIRouter, Response

from im_server.api.deps import ERRORS
from im_server.api.parsing import StrictJsonRoute
from im_server.protocol.schema import ws_schema

router = APIRouter(
    prefix="/v1/protocol", tags=["protocol"], responses=ERRORS, route_class=StrictJsonRoute
)
MEDIA_TYPE = "application/schema+json"


@functools.cache
def _encoded() -> bytes:
    return orjson.dumps(ws_schema())


@router.get(
    "/ws-schema",
    summary="The WebSocket frames as a JSON Schema (draft 2020-12)",
    description="Top level: `anyOf` of `$defs.client_frame` and `$defs.server_frame`, "
    "each a `oneOf` told apart by `type`. No token needed.",
    response_class=Response,
    responses={200: {"content": {MEDIA_TYPE: {"schema": {"type": "object"}}}}},
)
async def get_ws_schema() -> Response:
    return Response(
        _encoded(), media_type=MEDIA_TYPE, headers={"Cache-Control": "public, max-age=3600"}
    )
