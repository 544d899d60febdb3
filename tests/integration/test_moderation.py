"""Group moderation (PROTOCOL.md "Accounts: deletion; groups: moderation"): the owner and
admins mute a member until a time (its sends are refused `muted`, on the WebSocket and
over REST, until then, and again allowed after, with nothing invalidated), lift it with
0, and recall any member's message at any age. Both are `system` notices in the group's
stream, so every device learns of them; bad input changes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from im_server.client import ApiError, Client
from tests.support import PASSWORD, ServerProcess, Stores, new_user, persisted
from tests.support import send_ok as _send

MAX_INT64 = 2**63 - 1


def now_ms() -> int:
    return int(time.time() * 1000)


async def _expect(call: Awaitable[Any], status: int, code: str) -> None:
    with pytest.raises(ApiError) as ei:
        await call
    assert (ei.value.status, ei.value.code) == (status, code), ei.value


@pytest.fixture(scope="module")
def short_recall(stores: Stores) -> Iterator[ServerProcess]:
    """A server whose senders may recall for one second only."""
    srv = ServerProcess(env={**stores.env(), "IM_RECALL_WINDOW_SECONDS": "1"}).start()
    yield srv
    srv.terminate()


async def _group(url: str) -> tuple[Client, Client, Client, Client, int, str]:
    """owner, admin, member, other member; the group id and its conversation."""
    owner = await new_user(url, "mo")
    admin, member, other = [await new_user(url, p) for p in ("ma", "mm", "mx")]
    g = await owner.create_group("moderated", [admin.user_id, member.user_id, other.user_id])
    await owner.set_role(g["group_id"], int(admin.user_id or 0), "admin")
    return owner, admin, member, other, int(g["group_id"]), str(g["conv_id"])


async def _notices(c: Client, conv: str, event: str) -> list[dict[str, Any]]:
    page = await c.history(conv, limit=100)
    return [
        m["content"]
        for m in page["messages"]
        if m["content_type"] == "system" and m["content"].get("event") == event
    ]


async def test_a_muted_member_is_refused_until_the_time_then_sends_again(url: str) -> None:
    owner, admin, member, other, gid, conv = await _group(url)
    try:
        watcher = await other.connect()
        until = now_ms() + 2500
        await admin.mute_member(gid, int(member.user_id or 0), until)
        conn = await member.connect()
        ack = await conn.send(conv, "let me speak")
        assert ack["ok"] is False and ack["code"] == "muted", ack
        await _expect(member.send_rest(conv, "and now?"), 403, "muted")
        # the others are not muted
        assert (await conn.send(conv, "x"))["code"] == "muted"
        await _send(other, conv, "I still can")
        # every device learns of it through the stream
        notice = await watcher.next_event(
            "message",
            10.0,
            lambda f: (
                f["message"]["content_type"] == "system"
                and f["message"]["content"].get("event") == "member_muted"
            ),
        )
        assert notice["message"]["content"] == {
            "event": "member_muted",
            "actor": admin.user_id,
            "user_ids": [member.user_id],
            "until": until,
        }
        assert notice["message"]["sender_id"] == admin.user_id
        listed = {m["user_id"]: m["muted_until"] for m in await member.members(gid)}
        assert listed[member.user_id] == until and listed[other.user_id] is None, listed

        # the time passes: allowed again, with nothing changed meanwhile
        await asyncio.sleep(max(0.0, (until - now_ms()) / 1000) + 0.2)
        ack = await conn.send(conv, "thank you")
        assert ack["ok"] is True, ack
        listed = {m["user_id"]: m["muted_until"] for m in await owner.members(gid)}
        assert listed[member.user_id] is None
        await conn.close()
        await watcher.close()
    finally:
        for c in (owner, admin, member, other):
            await c.aclose()


async def test_lifting_a_mute_with_zero(url: str) -> None:
    owner, admin, member, other, gid, conv = await _group(url)
    try:
        await owner.mute_member(gid, int(member.user_id or 0), now_ms() + 3_600_000)
        await _expect(member.send_rest(conv, "muted"), 403, "muted")
        await owner.mute_member(gid, int(member.user_id or 0), 0)
        seq = await _send(member, conv, "free again")
        await persisted(owner, conv, seq)
        lifted = await _notices(owner, conv, "member_unmuted")
        assert lifted == [
            {"event": "member_unmuted", "actor": owner.user_id, "user_ids": [member.user_id]}
        ]
        assert len(await _notices(owner, conv, "member_muted")) == 1
    finally:
        for c in (owner, admin, member, other):
            await c.aclose()


async def test_who_may_mute_whom(url: str) -> None:
    owner, admin, member, other, gid, conv = await _group(url)
    outsider = await new_user(url, "mout")
    later = now_ms() + 3_600_000
    try:
        # a plain member may not mute; an admin may not mute the owner or an admin
        await _expect(member.mute_member(gid, int(other.user_id or 0), later), 403, "forbidden")
        await _expect(admin.mute_member(gid, int(owner.user_id or 0), later), 403, "forbidden")
        await owner.set_role(gid, int(other.user_id or 0), "admin")
        await _expect(admin.mute_member(gid, int(other.user_id or 0), later), 403, "forbidden")
        # nobody mutes himself; the owner may mute an admin
        await _expect(admin.mute_member(gid, int(admin.user_id or 0), later), 400, "bad_request")
        await owner.mute_member(gid, int(admin.user_id or 0), later)
        await _expect(admin.send_rest(conv, "muted admin"), 403, "muted")
        # outsiders and strangers
        await _expect(outsider.mute_member(gid, int(member.user_id or 0), later), 403, "not_member")
        await _expect(owner.mute_member(gid, int(outsider.user_id or 0), later), 404, "not_found")
        await _expect(
            owner.mute_member(2**62 + 99, int(member.user_id or 0), later), 404, "not_found"
        )
        # nothing of that changed anyone else's rights
        await _send(member, conv, "still fine")
        assert len(await _notices(owner, conv, "member_muted")) == 1
    finally:
        for c in (owner, admin, member, other, outsider):
            await c.aclose()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"until": -1},
        {"until": MAX_INT64 + 1},
        {"until": "1767225600000"},
        {"until": 1.5},
        {"until": True},
        {"until": None},
        [],
        "until",
    ],
)
async def test_bad_mute_bodies_change_nothing(url: str, body: Any) -> None:
    owner, admin, member, other, gid, conv = await _group(url)
    try:
        path = f"/v1/groups/{gid}/members/{member.user_id}/mute"
        with pytest.raises(ApiError) as ei:  # 422 for a body of the wrong shape
            await owner.request("PUT", path, json=body)
        assert ei.value.status in (400, 422) and ei.value.code == "bad_request", ei.value
        await _send(member, conv, "not muted")
        assert {m["user_id"]: m["muted_until"] for m in await owner.members(gid)}[
            member.user_id
        ] is None
    finally:
        for c in (owner, admin, member, other):
            await c.aclose()


async def test_admins_recall_any_message_at_any_age(short_recall: ServerProcess) -> None:
    owner, admin, member, other, gid, conv = await _group(short_recall.url)
    try:
        old = await _send(member, conv, "said too much")
        mine = await _send(admin, conv, "mine, long ago")
        await persisted(owner, conv, mine)
        await asyncio.sleep(1.2)  # past the senders' recall window (1 s on this server)
        await _expect(member.recall(conv, old), 403, "forbidden")
        await _expect(other.recall(conv, old), 403, "forbidden")  # a plain member: never
        r = await admin.recall(conv, old)
        assert r["seq"] == old and r["recall_seq"] > mine, r
        await _expect(owner.recall(conv, old), 409, "conflict")  # once
        assert (await admin.recall(conv, mine))["seq"] == mine
        for reader in (member, other):
            page = await reader.history(conv, limit=100)
            by_seq = {m["seq"]: m for m in page["messages"]}
            assert by_seq[old]["recalled"] is True and by_seq[mine]["recalled"] is True
            notices = [m for m in page["messages"] if m["content_type"] == "recall"]
            assert {n["content"]["seq"] for n in notices} == {old, mine}
            assert {n["sender_id"] for n in notices} == {admin.user_id}
    finally:
        for c in (owner, admin, member, other):
            await c.aclose()


async def test_a_mute_reaches_every_process(url: str, short_recall: ServerProcess) -> None:
    """The mute is made on one process; the member sends through another one (on the
    same stores) that has just used the group's rights."""
    owner, admin, member, other, gid, conv = await _group(url)
    far = await Client.login(short_recall.url, str(member.username), PASSWORD, device_id="far")
    try:
        await _send(far, conv, "before")
        await owner.mute_member(gid, int(member.user_id or 0), now_ms() + 3_600_000)
        await _expect(far.send_rest(conv, "now?"), 403, "muted")
        conn = await far.connect()
        ack = await conn.send(conv, "and here?")
        assert ack["ok"] is False and ack["code"] == "muted", ack
        await conn.close()
    finally:
        await far.aclose()
        for c in (owner, admin, member, other):
            await c.aclose()
