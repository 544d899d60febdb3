"""A message's way to its members' devices: at once when the members are cached, else
after loading them, off the sender's path."""

from __future__ import annotations

import logging

from im_server.context import Context
from im_server.protocol.ids import ConvRef
from im_server.protocol.server_frames import message_frame
from im_server.services import members
from im_server.storage.redis.store import SendArgs

log = logging.getLogger("im_server.send")


def fan_out(
    ctx: Context,
    ref: ConvRef,
    seq: int,
    sender_id: int,
    cmid: str,
    ctype: str,
    content_json: str,
    ts: int,
    exclude_conn: int | None,
    args: SendArgs | None = None,
) -> None:
    """Push the message to every device of every member but ``exclude_conn``; at once
    when the members are cached, else after loading them (off the sender's path)."""
    if args is None:
        frame = message_frame(ref.conv_id, seq, sender_id, cmid, ctype, content_json, ts)
    else:
        frame = message_frame(
            ref.conv_id,
            seq,
            sender_id,
            cmid,
            ctype,
            content_json,
            ts,
            mentions=args.mentions,
            mention_all=args.mention_all,
            reply_to=args.reply_to,
        )
    users = members.cached_recipients(ctx, ref)
    if users is not None:
        ctx.events.push(users, frame, exclude_conn)
        return

    async def _later() -> None:
        try:
            ctx.events.push(await members.recipients(ctx, ref), frame, exclude_conn)
        except Exception as e:  # noqa: BLE001 - the message is queued; devices catch up by sync
            log.warning("fan-out of %s/%d skipped, members unknown: %r", ref.conv_id, seq, e)

    ctx.spawn(_later())
