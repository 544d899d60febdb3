"""Request bodies of the REST API, built from the wire types of ``protocol/types.py``;
their examples feed the OpenAPI page.

Strict, like WebSocket frames: ``true`` is not an integer, ``1.0`` is not an integer,
``5`` is not a string. Unknown fields are ignored. A wrong type or value is answered
``400``; a missing field ``422`` (see ``parsing.validation_status``). Username, password,
display name, note and group name rules (Unicode, lengths) stay with the services, which
answer them with specific messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator
from pydantic.config import JsonDict

from im_server.protocol.attachments import FILENAME_MAX, MimeType
from im_server.protocol.client_frames import SendFields
from im_server.protocol.types import (
    MAX_INT64,
    ConvId,
    ExternalId,
    JsonObject,
    ReportedSeq,
    Rule,
    UserId,
)

MuteUntil = Annotated[
    int,
    Strict(),
    Field(ge=0, le=MAX_INT64),
    Rule("must be milliseconds since the Unix epoch (0, or a time past, lifts the mute)"),
]


def _body(*examples: JsonDict) -> ConfigDict:
    return ConfigDict(strict=True, extra="ignore", json_schema_extra={"examples": list(examples)})


class NewUser(BaseModel):
    model_config = _body({"username": "alice", "password": "correct horse"})
    username: str = Field(
        description="3-32 characters (NFKC; a wide character counts as two) of Unicode "
        "letters, marks, digits, '_', '.', '-'; unique regardless of case"
    )
    password: str = Field(description="8-256 characters")
    display_name: str | None = Field(None, description="1-64 characters; the username if absent")


class NewSession(BaseModel):
    model_config = _body({"username": "alice", "password": "correct horse", "device_id": "phone"})
    username: str
    password: str
    device_id: str | None = Field(
        None, description="1-64 of [A-Za-z0-9_.:-]; 16 random hex characters if absent"
    )
    device_name: str | None = Field(
        None,
        description="what 'my devices' calls this session (1-64 characters); "
        "without it, the browser and platform of the User-Agent",
    )


class PasswordChange(BaseModel):
    model_config = _body({"old_password": "correct horse", "new_password": "battery staple"})
    old_password: str
    new_password: str = Field(description="8-256 characters")


class AccountDeletion(BaseModel):
    model_config = _body({"password": "correct horse"})
    password: str = Field(description="my current password")


class FriendRequestBody(BaseModel):
    model_config = _body({"to_user_id": 2, "note": "hi, it's Alice"})
    to_user_id: UserId
    note: str | None = Field(None, description="at most 256 characters")


class NewGroup(BaseModel):
    model_config = _body({"name": "team", "member_ids": [2, 3]})
    name: str = Field(description="1-64 characters after trimming")
    member_ids: list[UserId] = Field(
        default_factory=list, description="at most 5000; the creator and duplicates ignored"
    )


class AddMembers(BaseModel):
    model_config = _body({"user_ids": [4], "with_history": False})
    user_ids: list[UserId] = Field(description="1-5000 user ids")
    with_history: bool = False


class SendBody(SendFields):
    """The fields of the WebSocket ``send`` frame; the path names the conversation."""

    model_config = _body(
        {"client_msg_id": "6f1c2b0e9a", "content_type": "text", "content": {"text": "hello"}}
    )


class EditBody(BaseModel):
    """The new content of my message (the rules of a send's content; a ``text`` message
    keeps a non-empty ``text``)."""

    model_config = _body({"content": {"text": "hello again"}})
    content: JsonObject


class ReadBody(BaseModel):
    model_config = _body({"seq": 42})
    seq: ReportedSeq


class SettingsBody(BaseModel):
    """A field left out keeps its value; ``null`` is not a value."""

    model_config = _body({"muted": True}, {"pinned": True, "muted": False})
    muted: bool | None = Field(None, description="mute pushes and the badge (mentions still count)")
    pinned: bool | None = Field(None, description="list this conversation first")

    @field_validator("muted", "pinned", mode="before")
    @classmethod
    def _not_null(cls, v: object) -> object:
        if v is None:
            raise ValueError("must be true or false when present")
        return v


class MuteBody(BaseModel):
    model_config = _body({"until": 1767225600000}, {"until": 0})
    until: MuteUntil


class RoleBody(BaseModel):
    model_config = _body({"role": "admin"})
    role: Literal["admin", "member"]


class PushRegistrationBody(BaseModel):
    """Where to push for this session's device (a Matrix push-gateway pusher's keys)."""

    model_config = _body(
        {"app_id": "com.example.im.ios", "pushkey": "a1b2c3d4e5f6", "platform": "apns"}
    )
    app_id: str = Field(description="1-64 characters of [A-Za-z0-9._-] (reverse DNS style)")
    pushkey: str = Field(
        description="1-512 printable ASCII characters: the APNs device token (hex), the "
        "FCM registration token, or a Web Push subscription's keys.p256dh"
    )
    platform: Literal["apns", "fcm", "webpush"]
    data: dict[str, Any] | None = Field(
        None,
        description="webpush only, and required there: {endpoint, auth} of the subscription "
        "(optional events_only, default_payload); at most 1 KiB as JSON",
    )


class UploadBody(BaseModel):
    """What I am about to upload: the presigned PUT is bound to this type and size."""

    model_config = _body(
        {"content_type": "image/jpeg", "size": 482133, "filename": "beach.jpg"},
        {"content_type": "application/pdf", "size": 90211},
    )
    content_type: MimeType = Field(description="the bytes' media type, e.g. image/jpeg")
    size: int = Field(ge=1, le=2**53, description="bytes; above the limit is 413 too_large")
    filename: str | None = Field(
        None, description=f"1-{FILENAME_MAX} characters, offered on download; no folders"
    )


# -- the app's servers (/v1/server/) ----------------------------------------------------------


class AppUserBody(BaseModel):
    """A field left out keeps its value (a new user's display name: its external id)."""

    model_config = _body({"display_name": "Alice", "kind": "user"}, {"kind": "bot"})
    display_name: str | None = Field(None, description="1-64 characters")
    kind: Literal["user", "bot"] | None = Field(None, description="user (the default) or bot")


class ImportedUser(BaseModel):
    model_config = _body({"external_id": "u-1001", "display_name": "Alice"})
    external_id: ExternalId
    display_name: str | None = Field(None, description="1-64 characters")
    kind: Literal["user", "bot"] | None = None


class UsersImport(BaseModel):
    model_config = _body({"users": [{"external_id": "u-1001", "display_name": "Alice"}]})
    users: list[ImportedUser] = Field(
        max_length=10_000, description="1-10000 users, each external_id once"
    )


class MintBody(BaseModel):
    model_config = _body({"device_id": "web", "ttl_s": 86400}, {})
    device_id: str | None = Field(
        None, description="1-64 of [A-Za-z0-9_.:-]; 16 random hex characters if absent"
    )
    ttl_s: int | None = Field(
        None, ge=60, le=MAX_INT64, description="seconds the token lasts (absent: until revoked)"
    )


class ServerMessage(SendFields):
    """A send as the user ``from``: the fields of a send, and the conversation."""

    model_config = _body(
        {
            "from": "u-1001",
            "conv_id": "s:1:2",
            "client_msg_id": "order-77-shipped",
            "content_type": "text",
            "content": {"text": "your order shipped"},
        }
    )
    sender: ExternalId = Field(alias="from", description="the sender's external_id")
    conv_id: ConvId


class ServerGroup(BaseModel):
    model_config = _body({"name": "team", "owner": "u-1001", "members": ["u-1002", "u-1003"]})
    name: str = Field(description="1-64 characters after trimming")
    owner: ExternalId
    members: list[ExternalId] = Field(
        default_factory=list, max_length=5000, description="at most 5000; the owner ignored"
    )


class ServerMemberBody(BaseModel):
    model_config = _body({"with_history": False})
    with_history: bool = False


class Friendship(BaseModel):
    model_config = _body({"a": "u-1001", "b": "u-1002"})
    a: ExternalId
    b: ExternalId


class NewWebhook(BaseModel):
    model_config = _body({"url": "https://app.example/im-events", "events": ["*"]})
    url: str = Field(max_length=2048, description="http or https; not a private address")
    events: list[str] = Field(max_length=20, description='event types, or ["*"] for every one')
