"""How REST requests are read, strictly.

- JSON bodies go through orjson, as WebSocket frames do: strict RFC 8259, so ``NaN``,
  ``Infinity`` and lone surrogates are refused (422 ``bad_request``) instead of being
  stored as null or failing later in the database; an integer outside the signed 64-bit
  range is refused (400 ``bad_request``) instead of being rounded to a float
  (``protocol/json_ints.py``).
- Integers in paths and queries are ASCII digits only: Python's ``int()`` and pydantic's
  lax mode also take ``1_0``, ``+10``, `` 10`` and full-width digits, which a client never
  means and a cache or a proxy would read differently.
- Body fields are typed strictly (``api/schemas.py``); a validation failure is ``422``
  when the body is not a JSON object or lacks a field, ``400`` when a field has the wrong
  type or value (:func:`validation_status`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Annotated, Any

import orjson
from fastapi import Path, Request, Response
from fastapi.routing import APIRoute
from pydantic import BeforeValidator

from im_server.errors import bad_request
from im_server.protocol.json_ints import INT_RULE, oversized_int
from im_server.protocol.types import MAX_INT64

_UINT = re.compile(r"[0-9]{1,19}")
_DECIMAL = re.compile(r"[0-9]{1,19}(?:\.[0-9]{1,9})?")


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # orjson.JSONDecodeError is a json.JSONDecodeError: FastAPI answers it as a
            # validation error (422), like any other malformed body
            body = await self.body()
            self._json = orjson.loads(body)
            if (big := oversized_int(body)) is not None:
                raise bad_request(f"{INT_RULE}: {big}")
        return self._json


class StrictJsonRoute(APIRoute):
    """The route class of every router: its endpoints read JSON with orjson."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict


def parse_uint(raw: str, name: str, *, minimum: int = 0, maximum: int = MAX_INT64) -> int:
    """A non-negative integer written in ASCII digits, within [minimum, maximum]."""
    if not _UINT.fullmatch(raw):
        raise bad_request(f"{name} must be an integer (ASCII digits)")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise bad_request(f"{name} must be between {minimum} and {maximum}")
    return value


def query_uint(request: Request, name: str, *, minimum: int = 0) -> int | None:
    """An optional integer query parameter (absent or empty: None)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    return parse_uint(raw, name, minimum=minimum)


def query_decimal(request: Request, name: str) -> float | None:
    """An optional non-negative decimal query parameter (``2``, ``0.5``; no exponent,
    no ``inf``/``nan``)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not _DECIMAL.fullmatch(raw):
        raise bad_request(f"{name} must be a number like 2 or 0.5 (ASCII digits)")
    return float(raw)


def _ascii_id(value: object) -> object:
    if isinstance(value, str) and not _UINT.fullmatch(value):
        raise ValueError("must be a positive integer (ASCII digits)")
    return value


# a server-chosen id in a path: a positive 64-bit integer in ASCII digits
Id = Annotated[int, BeforeValidator(_ascii_id), Path(ge=1, le=MAX_INT64)]


_NOT_A_VALUE = frozenset({"missing", "json_invalid"})


def validation_status(errors: Sequence[Any]) -> int:
    """The status of a refused request: ``400`` when the first error is a body field of
    the wrong type or value, or the body breaks a rule over several fields (the request
    was understood, one value is wrong), ``422`` for malformed JSON, a body that is not
    an object, a missing field, or a bad path."""
    first = errors[0] if errors else None
    if not isinstance(first, dict):
        return 422
    loc = tuple(first.get("loc", ()))
    if len(loc) >= 2 and loc[0] == "body" and first.get("type") not in _NOT_A_VALUE:
        return 400
    if loc == ("body",) and first.get("type") == "bad_value":
        # a rule over several fields of a body that parsed (a picture without its
        # upload): one value is wrong, as above
        return 400
    return 422
