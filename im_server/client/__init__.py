"""Async client for the IM server: REST calls, one WebSocket, and a syncing device.

Used by the integration tests, the benchmarks and the terminal chat, so it speaks the
public contract (PROTOCOL.md) and nothing else: no server module is imported here.

* :class:`Client` (``http``) wraps the REST API for one user session, over an
  :class:`HttpPool` (``transport``, aiohttp) that many clients may share.
* :class:`Connection` (``socket``) is one WebSocket: acks matched to sends, events queued.
* :class:`SyncState` (``sync``) is the catch-up arithmetic, pure logic without I/O.
* :class:`Device` (``device``) combines the three to follow the catch-up recipe.
* :class:`ServerClient` (``server_api``) is the app's servers' client (``X-Api-Key``).

The modules import one another in that order only (``errors`` and ``wire`` below all).
"""

from im_server.client.device import Device
from im_server.client.errors import ApiError, ConnectionLost
from im_server.client.http import Client
from im_server.client.server_api import ServerClient
from im_server.client.socket import Connection, EventCallback, open_connection
from im_server.client.sync import SeqRange, SyncState
from im_server.client.transport import HttpPool, Response, TransportError, request_sync
from im_server.client.wire import JsonObject, conv_path, group_conv_id, single_conv_id

__all__ = [
    "ApiError",
    "Client",
    "Connection",
    "ConnectionLost",
    "Device",
    "EventCallback",
    "HttpPool",
    "JsonObject",
    "Response",
    "ServerClient",
    "SeqRange",
    "SyncState",
    "TransportError",
    "conv_path",
    "group_conv_id",
    "open_connection",
    "request_sync",
    "single_conv_id",
]
