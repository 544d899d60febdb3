"""Response bodies of the REST API, so that ``/openapi.json`` shows what each call answers.

Built from the same wire types as the frames (a history page holds the very ``Message``
the ``message`` push carries). Extra fields are forbidden: a service that starts returning
a field these models do not name fails its tests loudly instead of losing the field
silently. A field that is absent in some answers (not null) is marked so in its model and
its route drops it with ``response_model_exclude_none``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from im_server.protocol.server_frames import Message
from im_server.protocol.types import (
    ConvId,
    Count,
    GroupId,
    RequestId,
    Role,
    Seq,
    Timestamp,
    UserId,
    Version,
)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- accounts -------------------------------------------------------------------------------


class Registered(Answer):
    user_id: UserId
    username: str = Field(description="as stored: NFKC-normalised")


class SessionToken(Answer):
    token: str = Field(description="the bearer token of this device's session")
    user_id: UserId
    device_id: str


class SessionInfo(Answer):
    device_id: str
    label: str = Field(
        description="the name given at login, or the browser and platform it came from "
        "('Chrome on Linux'); empty when neither is known"
    )
    created_at: Timestamp
    last_used_at: Timestamp
    current: bool = Field(description="the session of the token asking")


UserKind = Literal["user", "bot"]
KIND_DOC = "bot: a chat with it needs no friend request (POST /v1/bots/{user_id}/chat)"


class PublicUser(Answer):
    user_id: UserId
    username: str
    display_name: str
    kind: UserKind = Field("user", description=KIND_DOC)


class UserProfile(Answer):
    """A live user's public profile, or ``{user_id, deleted: true}`` for a deleted account
    (no username, no display name)."""

    user_id: UserId
    username: str | None = Field(None, description="absent for a deleted account")
    display_name: str | None = Field(None, description="absent for a deleted account")
    deleted: Literal[True] | None = Field(None, description="present (true) only when deleted")
    kind: UserKind | None = Field(None, description=KIND_DOC + "; absent for a deleted account")


# -- friends --------------------------------------------------------------------------------


class FriendRequestSent(Answer):
    request_id: RequestId
    conv_id: ConvId | None = Field(
        None, description="only when this accepted the other side's pending request"
    )
    accepted: Literal[True] | None = Field(
        None, description="only when this accepted the other side's pending request"
    )


class FriendRequest(Answer):
    request_id: RequestId
    from_user_id: UserId
    to_user_id: UserId
    note: str
    created_at: Timestamp
    from_username: str | None
    to_username: str | None


class FriendRequests(Answer):
    incoming: list[FriendRequest]
    outgoing: list[FriendRequest]


class Conversation(Answer):
    conv_id: ConvId


class Friend(Answer):
    user_id: UserId
    username: str
    conv_id: ConvId


# -- groups ---------------------------------------------------------------------------------


class GroupCreated(Answer):
    group_id: GroupId
    conv_id: ConvId


class GroupMember(Answer):
    user_id: UserId
    role: Role
    username: str | None
    muted_until: Timestamp | None = Field(
        None, description="muted by the owner or an admin until then (ms); null when not"
    )


class MembersAdded(Answer):
    group_id: GroupId
    added: list[UserId] = Field(
        description="who joined or re-joined; members already in are skipped"
    )


class RoleSet(Answer):
    user_id: UserId
    role: Literal["admin", "member"]


# -- conversations --------------------------------------------------------------------------


class _State(Answer):
    conv_id: ConvId
    min_seq: Seq = Field(description="my visible window, already clamped")
    max_seq: Seq = Field(description="counts persisted messages only; min_seq - 1 when empty")
    read_seq: Seq = Field(description="my read cursor, 0 until I report one")
    unread: Count
    mention_unread: Count = Field(description="of the unread, those that mention me or all")
    last_message: Message | None
    version: Version = Field(description="the sync version of the state's last change")
    muted: bool = Field(description="my setting: no pushes, only mentions count in the badge")
    pinned: bool = Field(description="my setting: listed first")


class SingleState(_State):
    type: Literal["single"]
    peer_id: UserId | None
    peer_read_seq: Seq
    peer_delivered_seq: Seq


class GroupState(_State):
    type: Literal["group"]
    group_id: GroupId
    name: str
    active: bool = Field(description="false once I was kicked or left")
    role: Role


ConversationState = Annotated[SingleState | GroupState, Field(discriminator="type")]


class HistoryPage(Answer):
    messages: list[Message]
    min_seq: Seq = Field(description="the real bounds of my window")
    max_seq: Seq
    is_end: bool


class SearchPage(Answer):
    results: list[Message] = Field(description="newest first")
    next_before: str | None = Field(
        description="opaque: pass as before for the next page; null at the end"
    )


class ReadResult(Answer):
    conv_id: ConvId
    read_seq: Seq = Field(description="my cursor after the call")


class Cleared(Answer):
    conv_id: ConvId
    min_seq: Seq


class ConversationSettings(Answer):
    conv_id: ConvId
    muted: bool
    pinned: bool


class Recalled(Answer):
    conv_id: ConvId
    seq: Seq
    recall_seq: Seq = Field(description="the seq of the recall notice")


class Receipts(Answer):
    seq: Seq
    read_count: Count
    member_count: Count
    readers: list[UserId] | None = Field(
        None, description="who read, ascending; absent in groups where receipts are counts only"
    )


class UnreadCount(Answer):
    conv_id: ConvId
    unread: Count
    mention_unread: Count = Field(description="of the unread, those that mention me or all")


class Unread(Answer):
    total: Count
    badge: Count = Field(
        description="unread over conversations I did not mute plus mention_unread over "
        "those I muted"
    )
    conversations: list[UnreadCount] = Field(description="only those with unread > 0")


# -- sync -----------------------------------------------------------------------------------


class _Synced(Answer):
    hidden: bool
    messages: list[Message] = Field(description="the newest visible messages, ascending")


class SyncedSingleState(SingleState, _Synced):
    pass


class SyncedGroupState(GroupState, _Synced):
    pass


SyncedState = Annotated[SyncedSingleState | SyncedGroupState, Field(discriminator="type")]


class SyncPage(Answer):
    version: Version = Field(description="safe: pass it as `since` next time")
    conversations: list[SyncedState] = Field(description="oldest change first")
    has_more: bool


# -- presence -------------------------------------------------------------------------------


class Presence(Answer):
    user_id: UserId
    online: bool | None = Field(description="null for a user whose presence I may not see")
    last_seen: Timestamp | None = Field(
        description="when the last connection closed (ms); null while online, if never "
        "seen, or for a user whose presence I may not see"
    )


# -- push -----------------------------------------------------------------------------------


class PushRegistration(Answer):
    app_id: str
    pushkey: str
    platform: Literal["apns", "fcm", "webpush"]
    device_id: str = Field(description="the device of the session the registration is tied to")
    data: dict[str, Any] = Field(
        description="what the gateway gets as devices[].data ({} but for webpush)"
    )


class WebPushConfig(Answer):
    app_id: str
    vapid_public_key: str = Field(
        description="base64url: pushManager.subscribe's applicationServerKey"
    )


class PushConfig(Answer):
    webpush: WebPushConfig | None = Field(
        None, description="absent when Web Push is not configured"
    )


# -- uploads --------------------------------------------------------------------------------


class UploadTicket(Answer):
    upload_id: str
    url: str = Field(description="where to send the bytes (a presigned URL of the object store)")
    method: Literal["PUT"]
    headers: dict[str, str] = Field(description="send exactly these headers with the bytes")
    expires_at: Timestamp = Field(description="the URL works until then (ms)")


class DownloadLink(Answer):
    url: str = Field(description="a short-lived presigned download URL")
    expires_at: Timestamp


# -- the app's servers (/v1/server/) ----------------------------------------------------------


class AppUserWritten(Answer):
    user_id: UserId
    external_id: str
    created: bool = Field(description="true when this call created the user")


class AppUserInfo(Answer):
    user_id: UserId
    external_id: str
    display_name: str
    kind: Literal["user", "bot"]


class ImportedId(Answer):
    external_id: str
    user_id: UserId


class UsersImported(Answer):
    users: list[ImportedId] = Field(description="in the order of the request")


class MintedToken(Answer):
    token: str = Field(description="a session token, like a login's")
    user_id: UserId
    device_id: str
    expires_at: Timestamp | None = Field(description="null: lasts until revoked (or idle)")


class WebhookCreated(Answer):
    webhook_id: int
    secret: str = Field(description="whsec_ + base64 of 32 random bytes; shown only here")


class WebhookInfo(Answer):
    webhook_id: int
    url: str
    events: list[str]
    created_at: Timestamp


class SecretRotated(Answer):
    secret: str = Field(description="the new secret; the old one also signs for 24 h")


class WebhookDelivery(Answer):
    event_id: str = Field(description="the delivery's webhook-id header (the same on retries)")
    type: str
    conv_key: str = Field(description="its order key: the conversation, or user:<id>")
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    created_at: Timestamp
    last_error: str | None


class WebhookDeliveries(Answer):
    deliveries: list[WebhookDelivery] = Field(description="newest first, at most 100")
