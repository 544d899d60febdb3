"""The Web Push settings: the VAPID public key must be what pushManager.subscribe takes
(an uncompressed P-256 point, base64url), or the server refuses to start; GET
/v1/push/config tells both values only when both are set."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from im_server.config import Settings
from im_server.services.push_registrations import push_config
from tests.support import vapid_public_key


def test_a_real_key_is_taken() -> None:
    key = vapid_public_key()
    s = Settings(webpush_app_id="com.example.im.web", webpush_vapid_public_key=key)
    assert s.webpush_vapid_public_key == key
    ctx: Any = SimpleNamespace(settings=s)
    assert push_config(ctx) == {
        "webpush": {"app_id": "com.example.im.web", "vapid_public_key": key}
    }


@pytest.mark.parametrize(
    "bad", ["x", "not base64 at all!", base64.urlsafe_b64encode(b"\x04" * 33).decode()]
)
def test_anything_else_refuses_to_start(bad: str) -> None:
    with pytest.raises(ValidationError):
        Settings(webpush_vapid_public_key=bad)


def test_config_is_empty_unless_both_are_set() -> None:
    for kwargs in (
        {},
        {"webpush_app_id": "com.example.im.web"},
        {"webpush_vapid_public_key": vapid_public_key()},
    ):
        ctx: Any = SimpleNamespace(settings=Settings(**kwargs))
        assert push_config(ctx) == {}
