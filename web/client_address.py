"""Who the client is when lipstream sits behind a reverse proxy.

Behind a proxy every request comes from the proxy's address, so per-address limits
would be shared by everyone. When the direct peer is one of ``server.trusted_proxies``,
the client is read from the one header they write, ``server.forwarded_header``:
``X-Forwarded-For`` (the default: nginx, Caddy, HAProxy, Traefik) or ``Forwarded`` (RFC
7239 ``for=``), never the other, since those proxies pass a client's own copy of the
other one on untouched. The client is the rightmost hop that is not itself a trusted
proxy, since only the hops our own proxies appended can be believed. A request from any
other peer keeps its peer address, and whatever forwarding headers it sent are ignored.
:func:`client_address_middleware` gives handlers the result as ``request.remote``; a
request that came through a proxy still carries the proxy headers, so it is never taken
for a local admin (``web/admin_auth.py``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import CIMultiDictProxy

from web.errors import Handler

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_FOR = re.compile(r'for=(?:"\[?([^\]";]+)\]?(?::\d+)?"|([^;,\s]+))', re.IGNORECASE)


def parse_networks(entries: Sequence[str]) -> list[Network]:
    """``entries`` (addresses or CIDRs) as networks; ValueError names a bad one."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network: {exc}") from exc
    return networks


def is_trusted(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


def forwarded_hops(headers: CIMultiDictProxy[str], header: str = "x-forwarded-for") -> list[str]:
    """Client hops named by ``header`` (``x-forwarded-for`` or ``forwarded``), oldest first;
    the other header is not read."""
    if header == "forwarded":
        return [a or b for value in headers.getall("Forwarded", []) for a, b in _FOR.findall(value)]
    hops: list[str] = []
    for value in headers.getall("X-Forwarded-For", []):
        hops += [hop.strip().strip("[]") for hop in value.split(",") if hop.strip()]
    return hops


def client_address(
    peer: str | None, hops: Sequence[str], networks: Sequence[Network]
) -> str | None:
    """The client: ``peer`` unless it is a trusted proxy, then the rightmost untrusted hop."""
    if peer is None or not networks or not is_trusted(peer, networks):
        return peer
    for hop in reversed(hops):
        if not is_trusted(hop, networks):
            return hop
    return hops[0] if hops else peer


def client_address_middleware(
    trusted_proxies: Sequence[object], header: str = "x-forwarded-for"
) -> Middleware:
    """A middleware that sets ``request.remote`` to the client behind trusted proxies, as
    named by their ``header``."""
    networks = parse_networks([str(p) for p in trusted_proxies])

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if networks:
            hops = forwarded_hops(request.headers, header)
            client = client_address(request.remote, hops, networks)
            if client is not None and client != request.remote:
                request = request.clone(remote=client)
        return await handler(request)

    return middleware
