"""The wire types on the REST side (pure): strict request bodies, exact response models,
and which status a refused body gets."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from im_server.api.parsing import validation_status
from im_server.api.responses import HistoryPage, Receipts, SingleState
from im_server.api.schemas import AddMembers, FriendRequestBody, ReadBody, RoleBody, SendBody


def test_send_body_is_the_send_frame_without_type_and_conv_id() -> None:
    body = SendBody.model_validate({"client_msg_id": "a", "content": {"text": "hi"}, "x": 1})
    assert (body.client_msg_id, body.content_type, body.content) == ("a", "text", {"text": "hi"})
    for bad in (
        {"client_msg_id": "a b", "content": {"text": "hi"}},
        {"client_msg_id": "a", "content_type": "system", "content": {"text": "hi"}},
        {"client_msg_id": "a", "content": {"text": ""}},
        {"client_msg_id": "a", "content": "hi"},
    ):
        with pytest.raises(ValidationError):
            SendBody.model_validate(bad)


def test_strict_bodies() -> None:
    assert ReadBody.model_validate({"seq": 2**64 - 1}).seq == 2**63 - 1  # clamped
    for body, model in (
        ({"seq": True}, ReadBody),
        ({"seq": "5"}, ReadBody),
        ({"to_user_id": 1.0}, FriendRequestBody),
        ({"to_user_id": 0}, FriendRequestBody),
        ({"user_ids": [1], "with_history": 1}, AddMembers),
        ({"user_ids": [True]}, AddMembers),
        ({"role": "owner"}, RoleBody),
    ):
        with pytest.raises(ValidationError):
            model.model_validate(body)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"type": "bad_value", "loc": ("body", "seq")}, 400),
        ({"type": "bool_type", "loc": ("body", "user_ids", 0)}, 400),
        ({"type": "missing", "loc": ("body", "seq")}, 422),
        ({"type": "json_invalid", "loc": ("body", 7)}, 422),
        ({"type": "bad_value", "loc": ("body",)}, 400),  # a rule over several fields
        ({"type": "model_attributes_type", "loc": ("body",)}, 422),
        ({"type": "missing", "loc": ("body",)}, 422),
        ({"type": "int_parsing", "loc": ("path", "user_id")}, 422),
    ],
)
def test_validation_status(error: dict[str, Any], status: int) -> None:
    assert validation_status([error]) == status


def test_validation_status_without_errors() -> None:
    assert validation_status([]) == 422


MESSAGE = {
    "conv_id": "s:1:2",
    "seq": 5,
    "sender_id": 2,
    "client_msg_id": "b-77",
    "content_type": "text",
    "content": {"text": "ok"},
    "server_time": 1764412345678,
    "recalled": False,
    "mentions": [],
    "mention_all": False,
    "reply_to": None,
    "edited_at": None,
    "reactions": [],
}


def test_response_models_are_exact() -> None:
    """A field a service adds without the model saying so fails loudly, not silently."""
    page = {"messages": [MESSAGE], "min_seq": 1, "max_seq": 5, "is_end": True}
    assert HistoryPage.model_validate(page).model_dump() == page
    with pytest.raises(ValidationError):
        HistoryPage.model_validate({**page, "next": 6})
    with pytest.raises(ValidationError):
        HistoryPage.model_validate({**page, "messages": [{**MESSAGE, "pinned": True}]})
    state = {
        "conv_id": "s:1:2",
        "type": "single",
        "min_seq": 1,
        "max_seq": 5,
        "read_seq": 4,
        "unread": 1,
        "mention_unread": 0,
        "last_message": None,
        "version": 311,
        "muted": False,
        "pinned": True,
        "peer_id": 2,
        "peer_read_seq": 5,
        "peer_delivered_seq": 5,
    }
    assert SingleState.model_validate(state).model_dump() == state
    with pytest.raises(ValidationError):
        SingleState.model_validate({**state, "group_id": 7})
    with pytest.raises(ValidationError):
        SingleState.model_validate({k: v for k, v in state.items() if k != "muted"})


def test_absent_fields_stay_absent() -> None:
    counts_only = Receipts.model_validate({"seq": 1, "read_count": 0, "member_count": 3})
    assert counts_only.model_dump(exclude_none=True) == {
        "seq": 1,
        "read_count": 0,
        "member_count": 3,
    }
