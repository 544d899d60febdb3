"""Schemathesis against the running server's own OpenAPI document: every operation, valid
and invalid inputs (schemathesis' default generation modes), authenticated as a real
user; the one check is that nothing answers 5xx.

The operations are collected from the app's OpenAPI document built in-process (the
eager ``schema.parametrize()``: schemathesis 4's lazy ``from_fixture`` loader does not
run under pytest 9, and the server's URL is only known once the session fixture has
started it); ``test_fuzzed_document_is_the_served_one`` checks that it is byte for byte
the document the running server serves at ``/openapi.json``. Every call goes to the
running shared server.

Nothing is excluded. The server API's operations (``/v1/server/``) are called with an
API key of every scope instead of the user's token. The ``DELETE`` calls under ``/v1/sessions`` revoke the token they are
called with (``current``, a device id that may be the caller's, or every session), so
each of their calls gets a token of its own (a fresh login of the same user); every
other call uses the fuzz user's main token.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from im_server.app import create_app
from im_server.client import request_sync
from tests.support import PASSWORD, Stores, api_key


@pytest.fixture
def fuzz_user(url: str) -> dict[str, Any]:
    username = f"fuzz{uuid.uuid4().hex[:10]}"
    body = {"username": username, "password": PASSWORD}
    r = request_sync("POST", f"{url}/v1/users", json=body, timeout=30)
    assert r.status_code == 201, r.text
    r = request_sync("POST", f"{url}/v1/sessions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return {"username": username, **r.json()}


@pytest.fixture(scope="module")
def fuzz_api_key(stores: Stores) -> str:
    return asyncio.run(api_key(stores))


DOCUMENT = create_app().openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_fuzzed_document_is_the_served_one(url: str) -> None:
    served = request_sync("GET", f"{url}/openapi.json", timeout=30)
    assert served.status_code == 200
    assert served.json() == DOCUMENT
    assert len(list(schema.get_all_operations())) >= 25


def _fresh_token(url: str, user: dict[str, Any]) -> str:
    r = request_sync(
        "POST",
        f"{url}/v1/sessions",
        json={"username": user["username"], "password": PASSWORD},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return str(r.json()["token"])


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_5xx(
    case: Any, url: str, fuzz_user: dict[str, Any], fuzz_api_key: str
) -> None:
    op = case.operation
    token = fuzz_user["token"]
    if op.method.upper() == "DELETE" and op.path.startswith("/v1/sessions"):
        token = _fresh_token(url, fuzz_user)
    headers = {"Authorization": f"Bearer {token}"}
    if op.path.startswith("/v1/server/"):
        headers = {"X-Api-Key": fuzz_api_key}  # the server API: an all-scope key
    response = case.call(base_url=url, headers=headers, timeout=40)
    case.validate_response(response, checks=[not_a_server_error])
