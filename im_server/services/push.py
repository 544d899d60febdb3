"""Who gets which push, with which badge (the rules of the contract's "Push notifications
to phones"), as plain functions over what the stores answer; the pusher
(``workers/pusher.py``) drives them from the durable rows.

- A new user message goes to every registered device of every other member who can see
  it and has no open connection on any process, unless that member muted the
  conversation and is not mentioned. Notices never get here: the persister writes push
  rows only for user messages.
- ``counts.unread`` is the member's badge right after that message: the badge statement
  (the one ``GET /v1/unread`` uses) read at push time, less the messages after this one
  in its conversation that count for that member, so a burst of three gives 1, 2, 3 and
  not 3, 3, 3 however far behind the pusher is. Other conversations count as they stand
  at push time (no order across conversations is kept).
- A badge-only push goes to a user's unconnected devices once the reads of a burst
  settled, with the badge then."""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import orjson
from pydantic import JsonValue

from im_server.context import Context
from im_server.protocol.push_gateway import (
    Notification,
    PushDevice,
    badge_notification,
    device,
    message_notification,
)
from im_server.services import presence
from im_server.services.accounts import idle_cutoff
from im_server.storage import conv_states
from im_server.storage import push as store
from im_server.storage import push_outbox as outbox_store
from im_server.storage.push import Registration
from im_server.storage.push_outbox import Later, PushMessage, Recipient

MessageKey = tuple[str, int]
# messages read after the first pushed one of a conversation, at most (a pusher that far
# behind gives badges a little early, never low)
TAIL_MAX = 5000


@dataclass(slots=True)
class Outgoing:
    """One gateway call: a notification for one user's devices."""

    key: MessageKey | None  # the message's row; None for a badge-only push
    user_id: int
    notification: Notification
    server_time: int  # the message's (for the latency metric); 0 for badge-only


def _devices(regs: Sequence[Registration], connected: Collection[str]) -> list[PushDevice]:
    return [device(r.app_id, r.pushkey, r.data) for r in regs if r.device_id not in connected]


class Tail:
    """The countable messages of one conversation after the first one pushed in a round
    (``storage.push_outbox.later_messages``), indexed so that "how many of them count for this
    member after this seq" is a few bisections, not a scan per (message, member)."""

    def __init__(self, later: Sequence[Later]) -> None:
        self._msgs = sorted(later, key=lambda t: t.seq)
        self._seqs = [t.seq for t in self._msgs]
        self._by_sender: dict[int, list[int]] = {}
        for t in self._msgs:
            self._by_sender.setdefault(t.sender_id, []).append(t.seq)
        self._mentioning: dict[int, list[int]] = {}

    @staticmethod
    def _between(seqs: list[int], lo: int, hi: int) -> int:
        """How many of ``seqs`` (sorted) are in (lo, hi]."""
        return max(0, bisect_right(seqs, hi) - bisect_right(seqs, lo))

    def counted(self, user_id: int, muted: bool, lo: int, hi: int) -> int:
        """Messages in (lo, hi] the member's unread count counts: not the member's own,
        and in a muted conversation only those that mention the member (or all)."""
        if not muted:
            return self._between(self._seqs, lo, hi) - self._between(
                self._by_sender.get(user_id, []), lo, hi
            )
        seqs = self._mentioning.get(user_id)
        if seqs is None:
            seqs = [
                t.seq
                for t in self._msgs
                if t.sender_id != user_id and (t.mention_all or user_id in t.mentions)
            ]
            self._mentioning[user_id] = seqs
        return self._between(seqs, lo, hi)


def plan_messages(
    msgs: Sequence[PushMessage],
    recips: Sequence[Recipient],
    regs: Mapping[int, Sequence[Registration]],
    connected: Mapping[int, Collection[str]],
    badges: Mapping[int, int],
    tails: Mapping[str, Tail],
    include_content: bool,
) -> list[Outgoing]:
    """The pushes for a round of messages. A push's badge is the member's badge now less
    the messages after it in its conversation that count for the member (``tails``):
    the badge right after that message, however many rounds the pusher is behind."""
    by_key = {(m.conv_id, m.seq): m for m in msgs}
    parsed: dict[MessageKey, JsonValue] = {}
    devices_of: dict[int, list[PushDevice]] = {}
    out: list[Outgoing] = []
    for r in recips:
        key = (r.conv_id, r.seq)
        m = by_key.get(key)
        if m is None:
            continue
        devices = devices_of.get(r.user_id)
        if devices is None:
            devices = _devices(regs.get(r.user_id, ()), connected.get(r.user_id, ()))
            devices_of[r.user_id] = devices
        if not devices:
            continue
        tail = tails.get(r.conv_id)
        later = 0
        if tail is not None:
            later = tail.counted(r.user_id, r.muted, max(r.seq, r.cursor), r.window_end)
        content: JsonValue | None = None
        if include_content and m.content is not None:
            if key not in parsed:
                parsed[key] = orjson.loads(m.content)
            content = parsed[key]
        n = message_notification(
            m.conv_id,
            m.seq,
            m.sender_id,
            m.sender_name if include_content else None,
            content,
            max(0, badges.get(r.user_id, 0) - later),
            devices,
        )
        out.append(Outgoing(key, r.user_id, n, m.server_time))
    return out


def plan_badges(
    user_ids: Sequence[int],
    regs: Mapping[int, Sequence[Registration]],
    connected: Mapping[int, Collection[str]],
    badges: Mapping[int, int],
) -> list[Outgoing]:
    out: list[Outgoing] = []
    for u in user_ids:
        devices = _devices(regs.get(u, ()), connected.get(u, ()))
        if devices:
            out.append(Outgoing(None, u, badge_notification(badges.get(u, 0), devices), 0))
    return out


async def message_work(ctx: Context, keys: Sequence[MessageKey]) -> list[Outgoing]:
    """The pushes of these claimed messages, from the state right now."""
    async with ctx.db.connect() as conn:
        msgs = await outbox_store.messages_to_push(conn, keys)
        recips = await outbox_store.recipients(
            conn, [(m.conv_id, m.seq) for m in msgs], conv_states.CURSOR
        )
        users = sorted({r.user_id for r in recips})
        regs = await store.registrations_of(conn, users, idle_cutoff(ctx.settings, _now_ms()))
    users = sorted(regs)
    connected = await presence.connected_devices(ctx, users)
    # badges only for the users who still have a device to push to
    wanted = [u for u in users if _devices(regs[u], connected.get(u, ()))]
    if not wanted:  # nobody to push to (the common case of a chat between open apps)
        return []
    firsts: dict[str, int] = {}
    for m in msgs:
        firsts[m.conv_id] = min(m.seq, firsts.get(m.conv_id, m.seq))
    # one snapshot for both: a message persisted between the two reads would be in the
    # tail but not in the badge, and the push would carry a badge one short
    async with ctx.db.connect() as raw:
        conn = await raw.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            badges = await conv_states.badges(conn, wanted)
            later = await outbox_store.later_messages(
                conn, firsts, conv_states.NOT_COUNTED, TAIL_MAX
            )
    by_conv: dict[str, list[Later]] = {}
    for t in later:
        by_conv.setdefault(t.conv_id, []).append(t)
    tails = {c: Tail(ts) for c, ts in by_conv.items()}
    return plan_messages(
        msgs, recips, regs, connected, badges, tails, ctx.settings.push_include_content
    )


async def badge_work(ctx: Context, user_ids: Sequence[int]) -> list[Outgoing]:
    async with ctx.db.connect() as conn:
        regs = await store.registrations_of(conn, user_ids, idle_cutoff(ctx.settings, _now_ms()))
    connected = await presence.connected_devices(ctx, sorted(regs))
    wanted = [u for u in sorted(regs) if _devices(regs[u], connected.get(u, ()))]
    async with ctx.db.connect() as conn:
        badges = await conv_states.badges(conn, wanted)
    return plan_badges(wanted, regs, connected, badges)


def _now_ms() -> int:
    return int(time.time() * 1000)
