"""The WebSocket close codes the server uses: the only place they are spelled out."""

from __future__ import annotations

from enum import IntEnum


class CloseCode(IntEnum):
    TOO_MANY_CONNECTIONS = 1008
    """At connect: the user already has the maximum of sockets on this process."""
    TOO_BIG = 1009
    """A frame over the size limit."""
    INTERNAL_ERROR = 1011
    """A bug in the server's frame handling; reconnect."""
    RESTART = 1012
    """The server is shutting down or restarting; reconnect."""
    TRY_AGAIN = 1013
    """At connect: the token cannot be checked (a store is down); later: the client fell
    behind and its queue of outgoing frames was full. Reconnect and catch up."""
    UNAUTHORIZED = 4401
    """Missing, unknown or revoked token (at connect, or once revoked)."""
