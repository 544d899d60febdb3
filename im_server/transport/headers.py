"""Security headers of HTTP responses, as raw ASGI header pairs."""

from __future__ import annotations

from urllib.parse import urlsplit

# on every HTTP response, errors of the transport included
BASE: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)

# The web client loads its scripts and styles from its own files only. Its WebSocket is
# same-host: CSP Level 3 lets 'self' match ws:/wss: of the page's own host and port.
# Attachments live on the object store, another origin: the page PUTs their bytes there
# and shows pictures from there (presigned URLs), so img-src and connect-src name it.


def origin(url: str | None) -> str | None:
    """``scheme://host[:port]`` of a URL, or None for none (or one without a host)."""
    if not url:
        return None
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def content_security_policy(store_origin: str | None = None) -> str:
    extra = f" {store_origin}" if store_origin else ""
    return "; ".join(
        (
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            f"img-src 'self' data: blob:{extra}",
            f"connect-src 'self'{extra}",
            "object-src 'none'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        )
    )


CONTENT_SECURITY_POLICY = content_security_policy()
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


def page_headers(store_origin: str | None = None) -> tuple[tuple[bytes, bytes], ...]:
    """On everything but the interactive API docs (whose page loads its scripts from a
    CDN); ``store_origin``: where clients reach the object store, if anywhere."""
    return (
        *BASE,
        (b"content-security-policy", content_security_policy(store_origin).encode()),
        (b"cross-origin-opener-policy", b"same-origin"),
        (b"permissions-policy", PERMISSIONS_POLICY.encode()),
    )


PAGE = page_headers()
