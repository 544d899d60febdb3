"""A session's label: the name a device gave at login, or its browser and platform read
from the User-Agent ("Chrome on Windows"), so "my devices" names each one.

The User-Agent is parsed by ua-parser (its regexes are compiled on first use, about
0.1 s: the parse runs in a thread, never on the event loop); at most ``UA_MAX``
characters of it are read."""

from __future__ import annotations

import asyncio

import ua_parser

from im_server.errors import bad_request, check_text

LABEL_MAX = 64
UA_MAX = 512


def check_device_name(value: object) -> str | None:
    """A name given at login: 1-64 characters of printable text, or absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > LABEL_MAX:
        raise bad_request(f"device_name: 1-{LABEL_MAX} characters")
    check_text(value, "device_name")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise bad_request("device_name must not contain control characters")
    return value.strip()


def label_of(user_agent: str) -> str:
    """The label "<browser> on <platform>", either alone when only one is known, or empty."""
    ua = user_agent[:UA_MAX]
    if not ua.strip():
        return ""
    r = ua_parser.parse(ua)
    browser = r.user_agent.family if r.user_agent and r.user_agent.family != "Other" else ""
    system = r.os.family if r.os and r.os.family != "Other" else ""
    label = f"{browser} on {system}" if browser and system else browser or system
    return label[:LABEL_MAX]


async def session_label(device_name: str | None, user_agent: str | None) -> str:
    if device_name:
        return device_name
    return await asyncio.to_thread(label_of, user_agent or "")
