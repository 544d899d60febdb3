"""Account deletion (``DELETE /v1/me``).

Two steps. The first is one transaction: the user is marked deleted, the username and
its key are freed (replaced by ``#deleted:<id>``, which no username can be), the display
name and the password hash are emptied and every session is revoked, their push
registrations with them; after its commit the sockets close (4401) on every process and
logging in fails.

The second, the clean-up, marks every friend removed on my side (their single-chat sends
to me are refused ``not_friends``), deletes the pending friend requests from and to me,
leaves every group through the normal leave (``member_left`` notice, ownership handed to
the senior admin, else the senior member), deletes any push registration left and marks
the clean-up done (``users.cleaned_at``). Each step is idempotent: a group already left
is skipped, and the leave checks membership under the sync-version lock, so two runs at
once leave each group once. The request runs it right after the commit; since the
caller's token is already dead, a deletion whose process died half-way is finished by the
periodic job ``account-deletion`` of any process (``finish_pending``). Friends' lists
leave out deleted accounts at once (by query), and messages stay, with their
``sender_id``."""

from __future__ import annotations

import logging

from im_server.context import Context
from im_server.errors import ImError, bad_request, check_text
from im_server.protocol.ids import single_conv_id
from im_server.services import groups, notify, permissions
from im_server.services.accounts import confirm_password, revoked
from im_server.storage import accounts as store
from im_server.storage import contacts, memberships
from im_server.storage import webhooks as webhook_store
from im_server.storage.db import now_ms

log = logging.getLogger("im_server.deletion")


async def do_delete_account(
    ctx: Context, user_id: int, password: object, client_host: str | None = None
) -> None:
    """Check the password (throttled and counted like a login), delete the account, then
    clean up. A failure of the clean-up is left to the periodic job: the deletion itself
    is committed."""
    if not isinstance(password, str) or len(password) > 256:
        raise bad_request("password: a string of at most 256 characters")
    check_text(password, "password")
    user = await confirm_password(ctx, user_id, password, client_host)
    await delete_account(ctx, user_id, user.password_hash)


async def delete_account(ctx: Context, user_id: int, password_hash: str | None = None) -> bool:
    """Delete the account, then clean up; False when it was deleted already. With
    ``password_hash`` (the one just checked), a password changed meanwhile is a
    ``conflict``; the app's servers delete their users without one."""
    async with ctx.db.begin() as conn:
        current = await store.lock_user(conn, user_id)
        if password_hash is not None and current != password_hash:
            raise ImError("conflict", "the password was changed meanwhile")
        if not await store.mark_deleted(conn, user_id, now_ms()):
            return False
        await webhook_store.user_events(conn, [user_id], "user.deleted", now_ms())
        hashes = await store.revoke_user_sessions(conn, user_id, now_ms())
    revoked(ctx, hashes)
    ctx.events.invalidate("user_tokens", str(user_id))  # app-signed tokens' sockets too
    log.info("account %d deleted", user_id)
    try:
        await finish(ctx, user_id)
    except Exception as e:  # noqa: BLE001 - committed: the periodic job finishes it
        log.warning("clean-up of deleted account %d left to the periodic job: %r", user_id, e)
    return True


async def finish(ctx: Context, user_id: int) -> None:
    """The clean-up of a deleted account; idempotent."""
    async with ctx.db.begin() as conn:
        friends = await contacts.remove_every_friend(conn, user_id)
        asked = await contacts.drop_pending_requests(conn, user_id)
    if friends:
        await permissions.permissions_changed(ctx, [single_conv_id(user_id, p) for p in friends])
    await notify.changed(ctx, [*friends, *asked])
    async with ctx.db.connect() as conn:
        group_ids = await memberships.active_groups_of(conn, user_id)
    for group_id in group_ids:
        try:
            await groups.do_leave(ctx, user_id, group_id)
        except ImError as e:
            # not_member / not_found: left already (another run) or the group is gone
            if e.code not in ("not_member", "not_found"):
                raise
    async with ctx.db.begin() as conn:
        await store.delete_push_registrations(conn, user_id)
        await store.mark_cleaned(conn, user_id, now_ms())


async def finish_pending(ctx: Context) -> None:
    """Finish the deletions whose clean-up is not done (their process died half-way, or
    a store failed); run by every process periodically."""
    async with ctx.db.connect() as conn:
        pending = await store.deletions_to_finish(conn, now_ms())
    for user_id in pending:
        await finish(ctx, user_id)
        log.info("clean-up of deleted account %d finished", user_id)
