"""Where a session may push an output: checked before anything connects.

An output makes the server open a connection to a URL an API client named. So the URL
must be RTMP (``rtmp://``, ``rtmps://``, naming a host and a stream) or, for WHIP,
``http://`` or ``https://`` naming a host, and, unless
``outputs.allow_private`` is on, every address its host resolves to must be a public
one: never loopback, private, link-local, multicast or reserved ranges, so that a
client cannot make the server reach into the network it runs in. The name is resolved
again when FFmpeg connects; a name that changes its answer in between (DNS rebinding)
is outside what this check can see, which is why the default refuses private targets
rather than relying on the check alone.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from streaming.exceptions import OutputError

RTMP = ("rtmp", "rtmps")
WHIP = ("http", "https")
MAX_URL = 2048
DEFAULT_PORTS = {"rtmp": 1935, "rtmps": 443, "http": 80, "https": 443}


async def check_target(url: str, *, allow_private: bool, schemes: tuple[str, ...] = RTMP) -> str:
    """``url`` if an output may push to it, else :class:`OutputError` saying why."""
    if len(url) > MAX_URL or any(c.isspace() or ord(c) < 32 for c in url):
        raise OutputError(f"an output URL is at most {MAX_URL} characters, without spaces")
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        raise OutputError(f"this output needs a {wanted} URL, got {parts.scheme!r}")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise OutputError("the output URL's port is not a number in 1..65535") from None
    host = parts.hostname
    if not host:
        raise OutputError("the output URL names no host")
    if schemes == RTMP and parts.path.strip("/").count("/") < 1:
        raise OutputError("an RTMP URL is rtmp://host[:port]/app/stream-key")
    if allow_private:
        return url
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OutputError(f"the output's host {host!r} does not resolve: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise OutputError(
                f"the output's host {host!r} is {address}, not a public address; "
                "set outputs.allow_private to push to your own network"
            )
    return url
