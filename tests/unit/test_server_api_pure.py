"""The server API's pure rules: scopes and key names, Idempotency-Key values and request
fingerprints, external ids."""

from __future__ import annotations

import pytest

from im_server.errors import ImError
from im_server.services import apikeys, app_users, idempotency
from im_server.storage.apikeys import ApiKeyRow


def test_scopes() -> None:
    assert apikeys.check_scopes(["users", " messages", "users"]) == ["messages", "users"]
    assert apikeys.check_scopes(["users", "all"]) == ["all"]
    for bad in ([], [""], ["admin"], ["users", "root"]):
        with pytest.raises(ImError):
            apikeys.check_scopes(bad)
    key = ApiKeyRow(1, "k", ("users",), 0, None, None)
    assert apikeys.allows(key, "users") and not apikeys.allows(key, "groups")
    assert apikeys.allows(ApiKeyRow(1, "k", ("all",), 0, None, None), "webhooks")


def test_key_names() -> None:
    assert apikeys.check_name("backend-1.prod") == "backend-1.prod"
    for bad in ("", "a" * 65, "has space", "ünï", "a/b"):
        with pytest.raises(ImError):
            apikeys.check_name(bad)


def test_idempotency_keys_and_fingerprints() -> None:
    assert idempotency.check_key("a" * 255) == "a" * 255
    for bad in ("", "a" * 256, "with space", "tab\t", "ü"):
        with pytest.raises(ImError):
            idempotency.check_key(bad)
    f = idempotency.fingerprint
    assert f("POST", "/v1/server/groups", b"{}") == f("POST", "/v1/server/groups", b"{}")
    assert f("POST", "/v1/server/groups", b"{}") != f("PUT", "/v1/server/groups", b"{}")
    assert f("POST", "/a", b"{}") != f("POST", "/b", b"{}")
    assert f("POST", "/a", b'{"x":1}') != f("POST", "/a", b'{"x":2}')
    # the parts are separated: moving a byte across the boundary is another request
    assert f("POST", "/ab", b"c") != f("POST", "/a", b"bc")


def test_external_ids() -> None:
    for ok in ("u-1", "a" * 128, "user@example.com", "tenant:42", "A.b_c"):
        assert app_users.check_external_id(ok) == ok
    for bad in ("", "a" * 129, "a b", "a/b", "ü", "a\n", "a#b"):
        with pytest.raises(ImError):
            app_users.check_external_id(bad)
