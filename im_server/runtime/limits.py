"""Process limits the server raises for itself at start-up."""

from __future__ import annotations

import resource


def raise_open_files() -> tuple[int, int]:
    """Raise the soft limit on open descriptors to the hard limit: every WebSocket holds
    one, and the usual soft default (1,024) would refuse connections long before memory
    or CPU run short. Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # a hard limit the platform does not accept as a soft one: keep the soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)
