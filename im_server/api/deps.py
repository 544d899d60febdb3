"""Dependencies shared by the routers: the service context and the bearer-token user."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from im_server.api.parsing import Id
from im_server.context import Context
from im_server.errors import ImError
from im_server.services import accounts


def get_ctx(request: Request) -> Context:
    return request.app.state.ctx  # type: ignore[no-any-return]


@dataclass(slots=True)
class Caller:
    user_id: int
    device_id: str
    token: str


async def get_caller(request: Request, ctx: Annotated[Context, Depends(get_ctx)]) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ImError("unauthorized", "send Authorization: Bearer <token>")
    session = await accounts.authenticate(ctx, token.strip())
    return Caller(session.user_id, session.device_id, token.strip())


def client_host(request: Request) -> str | None:
    """The client's address as the server sees it (``X-Forwarded-For`` is applied by the
    server only for the proxies it is told to trust)."""
    return request.client.host if request.client else None


__all__ = ["ERRORS", "Caller", "Ctx", "CurrentUser", "Id", "client_host", "get_caller", "get_ctx"]

Ctx = Annotated[Context, Depends(get_ctx)]
CurrentUser = Annotated[Caller, Depends(get_caller)]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "bad_request"},
    401: {"description": "unauthorized"},
    403: {"description": "forbidden / not_member / not_friends / blocked"},
    404: {"description": "not_found"},
}
