"""No secret in the server's log, at DEBUG, in text and in JSON: a server whose database
URL carries a password serves registrations, logins (a wrong password among them),
WebSockets opened with ``?token=`` (and a bearer header), frames, REST sends, a bad token
on REST and on the WebSocket; then its whole log (stdout and stderr) is searched for every
token and password used. The search first proves it looks in the right place: the lines
that would hold them are there, masked."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect as ws_connect

from im_server.client import ApiError, Client
from im_server.client.transport import HttpPool
from tests.support import PASSWORD, ServerProcess, Stores, befriend, eventually, new_user, send_ok


def _log(srv: ServerProcess) -> str:
    assert srv.log_path is not None
    return Path(srv.log_path).read_text(errors="replace")


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_no_secret_in_the_log(stores: Stores, fmt: str) -> None:
    # the embedded PostgreSQL asks for its password: the URL carries it, and it is used
    db_password = stores.pg.password
    db_url = stores.pg.url
    assert db_password and f":{db_password}@" in db_url
    wrong_password = f"wrong-pw-{uuid.uuid4().hex[:8]}"
    bad_rest_token = f"bad-rest-{uuid.uuid4().hex}"
    bad_ws_token = f"bad-ws-{uuid.uuid4().hex}"
    secrets = [PASSWORD, db_password, stores.redis.password, wrong_password]
    secrets += [bad_rest_token, bad_ws_token]

    srv = ServerProcess(
        env={
            **stores.env(),
            "IM_DATABASE_URL": db_url,
            "IM_LOG_LEVEL": "DEBUG",
            "IM_LOG_FORMAT": fmt,
        }
    ).start()
    clients: list[Client] = []
    try:
        url = srv.url
        alice, bob = await new_user(url, "logalice"), await new_user(url, "logbob")
        assert alice.username is not None
        second = await Client.login(url, alice.username, PASSWORD)
        clients += [alice, bob, second]
        secrets += [c.token or "" for c in clients]
        conv = await befriend(alice, bob)

        a_ws = await alice.connect(additional_headers={"Authorization": f"Bearer {alice.token}"})
        b_ws = await bob.connect()
        ack = await a_ws.send(conv, "over the socket")
        assert ack["ok"] is True, ack
        await b_ws.next_event("message")
        await a_ws.ping()
        await send_ok(bob, conv, "over REST")
        await second.logout()

        with pytest.raises(ApiError) as refused:
            await Client.login(url, alice.username, wrong_password)
        assert refused.value.status == 401
        async with HttpPool(timeout=10) as http:
            r = await http.get(
                url + "/v1/me", headers={"Authorization": f"Bearer {bad_rest_token}"}
            )
        assert r.status_code == 401
        # the token under percent-encoded names: the WebSocket accepts it (its parser
        # decodes names), and the log masks it by the decoded name
        ws_base = url.replace("http://", "ws://") + "/v1/ws?"
        for spelled in ("%74oken", "tok%65n", "%74%6F%6B%65%6E"):
            async with ws_connect(f"{ws_base}{spelled}={alice.token}") as raw:
                await raw.send('{"type":"ping"}')
                assert orjson.loads(await raw.recv())["type"] == "pong"
        # a token in the URL of anything but the WebSocket is refused, in any spelling
        async with HttpPool(timeout=10) as http:
            for spelled in ("token", "%74oken", "TOKEN", "access_token"):
                r = await http.get(
                    f"{url}/v1/me?{spelled}={alice.token}",
                    headers={"Authorization": f"Bearer {alice.token}"},
                )
                assert r.status_code == 400, (spelled, r.status_code, r.text)
                assert r.json()["error"]["code"] == "bad_request", r.text
            r = await http.get(
                f"{url}/v1/me?tokens=1", headers={"Authorization": f"Bearer {alice.token}"}
            )
            assert r.status_code == 200, r.text  # only the names the WebSocket reads

        stranger = Client(url, token=bad_ws_token)
        clients.append(stranger)
        bad_ws = await stranger.connect()
        assert await bad_ws.wait_closed() == 4401

        async def logged() -> bool:
            return _log(srv).count("WebSocket /v1/ws?token=***") >= 3 and (
                "/v1/ws?%74%6F%6B%65%6E=***" in _log(srv)
            )

        await eventually(logged, timeout=10)
    finally:
        for c in clients:
            await c.aclose()
        srv.terminate()

    text = _log(srv)
    # the lines that would carry the secrets are there, masked
    assert text.count("WebSocket /v1/ws?token=***") >= 3  # uvicorn, INFO, one per socket
    assert "Bearer ***" in text  # the WebSocket library's DEBUG dump of the handshake
    for spelled in ("%74oken", "tok%65n", "%74%6F%6B%65%6E"):
        assert f"/v1/ws?{spelled}=***" in text, spelled
    assert f"postgres:***@127.0.0.1:{stores.pg.port}" in text  # the store URLs at start-up
    for secret in secrets:
        assert secret and secret not in text, f"{secret!r} is in the log"
    if fmt == "json":
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        assert len(lines) > 20
        for line in lines:
            orjson.loads(line)
