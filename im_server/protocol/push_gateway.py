"""What the pusher sends to a push gateway and reads back: the Matrix push-gateway API
(``POST /_matrix/push/v1/notify``), which Sygnal and other gateways speak, so that one
gateway turns these into APNs and FCM deliveries.

``TypedDict``s like the server frames: one is built per (message, user) in a push burst,
where a dict literal costs nothing. A notification for a new message carries
``event_id`` (``"<conv_id>/<seq>"``: a repeat after a crash carries the same one),
``room_id``, ``type``, ``sender`` and, unless content is left out for privacy,
``sender_display_name`` and ``content``; a badge-only one carries just ``counts``,
``prio`` and ``devices``."""

from __future__ import annotations

from typing import Final, Literal, NotRequired

from pydantic import ConfigDict, JsonValue, TypeAdapter, with_config
from typing_extensions import TypedDict

NOTIFY_PATH: Final = "/_matrix/push/v1/notify"


@with_config(ConfigDict(extra="forbid"))
class PushDevice(TypedDict):
    app_id: str
    pushkey: str
    data: dict[str, JsonValue]


@with_config(ConfigDict(extra="forbid"))
class PushCounts(TypedDict):
    unread: int


@with_config(ConfigDict(extra="forbid"))
class Notification(TypedDict):
    event_id: NotRequired[str]
    room_id: NotRequired[str]
    type: NotRequired[Literal["message"]]
    sender: NotRequired[str]
    sender_display_name: NotRequired[str]
    content: NotRequired[JsonValue]
    counts: PushCounts
    prio: Literal["high", "low"]
    devices: list[PushDevice]


@with_config(ConfigDict(extra="forbid"))
class NotifyRequest(TypedDict):
    notification: Notification


@with_config(ConfigDict(extra="ignore"))
class NotifyAnswer(TypedDict):
    """The gateway's answer: the pushkeys it found dead (uninstalled app, expired token)."""

    rejected: NotRequired[list[str]]


NOTIFY_ANSWER: Final = TypeAdapter(NotifyAnswer)
NOTIFY_REQUEST: Final = TypeAdapter(NotifyRequest)


def device(app_id: str, pushkey: str, data: dict[str, JsonValue] | None = None) -> PushDevice:
    return {"app_id": app_id, "pushkey": pushkey, "data": data or {}}


def message_notification(
    conv_id: str,
    seq: int,
    sender_id: int,
    sender_name: str | None,
    content: JsonValue | None,
    badge: int,
    devices: list[PushDevice],
) -> Notification:
    """A new message's push. ``sender_name`` and ``content`` None: left out (privacy)."""
    n: Notification = {
        "event_id": f"{conv_id}/{seq}",
        "room_id": conv_id,
        "type": "message",
        "sender": str(sender_id),
        "counts": {"unread": badge},
        "prio": "high",
        "devices": devices,
    }
    if sender_name is not None:
        n["sender_display_name"] = sender_name
    if content is not None:
        n["content"] = content
    return n


def badge_notification(badge: int, devices: list[PushDevice]) -> Notification:
    """A badge-only push (the badge went down: I read elsewhere), low priority."""
    return {"counts": {"unread": badge}, "prio": "low", "devices": devices}
