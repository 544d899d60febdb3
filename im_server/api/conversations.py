"""Conversations: states, history, sends over REST, unread."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from im_server.api.deps import ERRORS, Ctx, CurrentUser
from im_server.api.parsing import StrictJsonRoute, parse_uint, query_uint
from im_server.api.responses import (
    Cleared,
    ConversationSettings,
    ConversationState,
    HistoryPage,
    ReadResult,
    Recalled,
    Receipts,
    Unread,
)
from im_server.api.schemas import EditBody, ReadBody, SendBody, SettingsBody
from im_server.errors import bad_request
from im_server.protocol.ids import parse_conv_id
from im_server.protocol.server_frames import AckOk, Edited
from im_server.services import conversations, history, reactions, read, send
from im_server.services.edits import do_edit
from im_server.services.recall import do_recall

router = APIRouter(
    prefix="/v1", tags=["conversations"], responses=ERRORS, route_class=StrictJsonRoute
)


def _seq_path(raw: str) -> int:
    """A seq in a path: a positive 64-bit integer, else 400."""
    return parse_uint(raw, "seq", minimum=1)


@router.get(
    "/conversations",
    response_model=list[ConversationState],
    summary="My conversation states (hidden ones left out)",
)
async def list_conversations(caller: CurrentUser, ctx: Ctx) -> list[dict[str, Any]]:
    return await conversations.list_states(ctx, caller.user_id)


@router.get(
    "/conversations/{conv_id}/messages",
    response_model=HistoryPage,
    summary="History by seq range, clamped to my window",
    description="Query: begin, end, limit (default 50, capped), order=asc|desc. Keeps the seqs nearest `end`.",
)
async def get_messages(
    conv_id: str, request: Request, caller: CurrentUser, ctx: Ctx
) -> dict[str, Any]:
    ref = parse_conv_id(conv_id)
    begin = query_uint(request, "begin")
    end = query_uint(request, "end")
    limit = query_uint(request, "limit", minimum=1)
    order = request.query_params.get("order", "asc")
    if order not in ("asc", "desc"):
        raise bad_request("order must be asc or desc")
    if begin is not None and end is not None and begin > end:
        raise bad_request("begin must not exceed end")
    s = ctx.settings
    limit = min(limit or s.history_limit_default, s.history_limit_max)
    return await history.get_history(ctx, caller.user_id, ref, begin, end, limit, order)


@router.post(
    "/conversations/{conv_id}/messages",
    summary="Send a message (the same pipeline and ack as the WebSocket)",
)
async def post_message(conv_id: str, body: SendBody, caller: CurrentUser, ctx: Ctx) -> AckOk:
    return await send.accept(ctx, caller.user_id, parse_conv_id(conv_id), body)


@router.post(
    "/conversations/{conv_id}/read",
    summary="Report read up to seq: the cursor only moves forward; answers once durable",
)
async def post_read(conv_id: str, body: ReadBody, caller: CurrentUser, ctx: Ctx) -> ReadResult:
    ref = parse_conv_id(conv_id)
    res = await read.do_cursor(ctx, "read", caller.user_id, ref, body.seq)
    return ReadResult(conv_id=ref.conv_id, read_seq=res.value)


@router.get(
    "/conversations/{conv_id}/messages/{seq}/receipts",
    response_model=Receipts,
    response_model_exclude_none=True,
    summary="Who read a message (from the members' cursors), by group size tier",
)
async def get_receipts(conv_id: str, seq: str, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await read.receipts(ctx, caller.user_id, parse_conv_id(conv_id), _seq_path(seq))


@router.post(
    "/conversations/{conv_id}/clear",
    response_model=Cleared,
    summary="Clear my side: my window starts after the current end",
)
async def clear(conv_id: str, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await conversations.do_clear(ctx, caller.user_id, parse_conv_id(conv_id))


@router.put(
    "/conversations/{conv_id}/settings",
    response_model=ConversationSettings,
    summary="My settings of a conversation: muted, pinned (fields left out keep their value)",
    description="Mine alone; my other devices get the state through sync. A request that "
    "changes nothing answers the current values and moves no version.",
)
async def put_settings(
    conv_id: str, body: SettingsBody, caller: CurrentUser, ctx: Ctx
) -> dict[str, Any]:
    ref = parse_conv_id(conv_id)
    return await conversations.do_settings(ctx, caller.user_id, ref, body.muted, body.pinned)


@router.delete(
    "/conversations/{conv_id}",
    status_code=204,
    summary="Hide from my list until a new message arrives",
)
async def hide(conv_id: str, caller: CurrentUser, ctx: Ctx) -> Response:
    await conversations.do_hide(ctx, caller.user_id, parse_conv_id(conv_id))
    return Response(status_code=204)


@router.post(
    "/conversations/{conv_id}/messages/{seq}/recall",
    response_model=Recalled,
    summary="Recall my message (within the recall window): a recall notice, the original blanked",
)
async def recall(conv_id: str, seq: str, caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await do_recall(ctx, caller.user_id, parse_conv_id(conv_id), _seq_path(seq))


@router.post(
    "/conversations/{conv_id}/messages/{seq}/edit",
    summary="Edit my message (within the edit window): an edit notice, the original updated",
    description="Idempotent: an edit to the current content answers the current edit "
    "and sends no notice; a repeated request never makes a second notice.",
)
async def edit(conv_id: str, seq: str, body: EditBody, caller: CurrentUser, ctx: Ctx) -> Edited:
    return await do_edit(ctx, caller.user_id, parse_conv_id(conv_id), _seq_path(seq), body.content)


@router.put(
    "/conversations/{conv_id}/messages/{seq}/reactions/{emoji:path}",
    status_code=204,
    summary="Put my reaction on a message (idempotent; a reaction notice when it changes)",
    description="emoji: URL-encoded, one fully-qualified Unicode emoji (1-32 code points).",
)
async def react(conv_id: str, seq: str, emoji: str, caller: CurrentUser, ctx: Ctx) -> Response:
    ref, n = parse_conv_id(conv_id), _seq_path(seq)
    await reactions.do_react(ctx, caller.user_id, ref, n, emoji, "add")
    return Response(status_code=204)


@router.delete(
    "/conversations/{conv_id}/messages/{seq}/reactions/{emoji:path}",
    status_code=204,
    summary="Take my reaction back (idempotent; a reaction notice when it changes)",
)
async def unreact(conv_id: str, seq: str, emoji: str, caller: CurrentUser, ctx: Ctx) -> Response:
    ref, n = parse_conv_id(conv_id), _seq_path(seq)
    await reactions.do_react(ctx, caller.user_id, ref, n, emoji, "remove")
    return Response(status_code=204)


@router.get(
    "/unread",
    response_model=Unread,
    summary="Unread counts of every conversation, from one SQL statement",
)
async def unread(caller: CurrentUser, ctx: Ctx) -> dict[str, Any]:
    return await conversations.unread(ctx, caller.user_id)
