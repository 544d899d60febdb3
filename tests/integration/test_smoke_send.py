"""End to end: friends, a WebSocket send, the ack, the push, history from PostgreSQL."""

from __future__ import annotations

from im_server.client import Client
from tests.support import eventually


async def test_message_flows_into_history(pair: tuple[Client, Client, str]) -> None:
    alice, bob, conv = pair
    ca = await alice.connect()
    cb = await bob.connect()
    ack = await ca.send(conv, "hello")
    assert ack["ok"] is True and ack["seq"] == 1 and ack["duplicate"] is False
    pushed = await cb.next_event("message")
    assert pushed["message"]["seq"] == 1 and pushed["message"]["content"] == {"text": "hello"}

    async def persisted() -> list[dict]:
        return (await bob.history(conv))["messages"]

    msgs = await eventually(persisted)
    assert [m["seq"] for m in msgs] == [1]
    assert (
        msgs[0]["sender_id"] == alice.user_id and msgs[0]["client_msg_id"] == ack["client_msg_id"]
    )
    await ca.close()
    await cb.close()
