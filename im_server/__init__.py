"""im-server: an async WebSocket instant-messaging server."""

__version__ = "0.1.0"
