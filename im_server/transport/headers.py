"""Security headers of HTTP responses, as raw ASGI header pairs."""

from __future__ import annotations

# on every HTTP response, errors of the transport included
BASE: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)

# The web client loads its scripts and styles from its own files only. Its WebSocket is
# same-host: CSP Level 3 lets 'self' match ws:/wss: of the page's own host and port.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    )
)
PERMISSIONS_POLICY = ", ".join(
    f"{feature}=()"
    for feature in (
        "accelerometer",
        "camera",
        "display-capture",
        "geolocation",
        "gyroscope",
        "magnetometer",
        "microphone",
        "payment",
        "usb",
    )
)

# on everything but the interactive API docs (whose page loads its scripts from a CDN)
PAGE: tuple[tuple[bytes, bytes], ...] = (
    *BASE,
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", PERMISSIONS_POLICY.encode()),
)
