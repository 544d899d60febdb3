"""Where the server may send requests on the app's behalf (webhook URLs): never to a
loopback, private, link-local (cloud metadata included), multicast, reserved or shared
address, checked on the URL as given, again on every address its name resolves to, and
again at each delivery (a name can be re-pointed after it was registered), unless
``IM_WEBHOOK_ALLOW_PRIVATE=true``. Redirects are not followed.

``GuardedResolver`` is the resolver of the delivering HTTP client: every connection's
addresses pass through it, so a name that resolves to a private address at delivery
time (DNS rebinding) is refused there; an IP literal never reaches a resolver, so
``check_url`` checks it."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from im_server.errors import bad_request

URL_MAX = 2048
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT


class RefusedAddress(Exception):
    """The URL's host is, or resolves to, an address the server must not call."""


def address_refused(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return (
        addr.is_private
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
        or (isinstance(addr, ipaddress.IPv4Address) and addr in _SHARED)
    )


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def check_url(url: str, allow_private: bool) -> tuple[str, int]:
    """(host, port) of a webhook URL: http or https, a host, no credentials; an IP
    literal that may not be called is refused here (``bad_request``)."""
    if len(url) > URL_MAX:
        raise bad_request(f"url: at most {URL_MAX} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise bad_request("url: not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad_request("url: an http or https URL with a host")
    if parts.username is not None or parts.password is not None:
        raise bad_request("url: no credentials in the URL (the signature authenticates)")
    host = parts.hostname
    ip = _literal(host)
    if ip is not None and not allow_private and address_refused(ip):
        raise bad_request("url: a loopback, private or link-local address is not allowed")
    return host, port or (443 if parts.scheme == "https" else 80)


async def check_resolved(host: str, port: int, allow_private: bool) -> None:
    """Every address the host resolves to must be callable (``bad_request``)."""
    if allow_private or _literal(host) is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout=5.0
        )
    except (OSError, TimeoutError):
        raise bad_request("url: the host does not resolve") from None
    if any(address_refused(str(info[4][0])) for info in infos):
        raise bad_request("url: the host resolves to a loopback, private or link-local address")


class GuardedResolver(AbstractResolver):
    """The system resolver, refusing a name with any address that may not be called."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = ThreadedResolver()
        self._allow = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if not self._allow and any(address_refused(str(r["host"])) for r in found):
            raise RefusedAddress(f"{host} resolves to an address that may not be called")
        return found

    async def close(self) -> None:
        await self._inner.close()
