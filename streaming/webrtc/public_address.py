"""Answers that name the address callers reach this machine at, behind a 1:1 NAT.

A server with a private address and a public one mapped to it port for port (a cloud VM,
a node behind a static NAT) gathers only its private host candidates: callers outside
cannot reach them. With ``server.ice_public_address`` set, every host candidate of the
answer gets a twin at that address and the same port, one step lower in priority (a
caller on the same network still prefers the direct one). Connectivity checks sent to
the twin arrive, through the NAT, at the socket the original candidate names, and ICE
answers them as usual (``docs/design/webrtc.md`` §6). A STUN server in
``server.ice_servers`` finds the same address by itself; this needs none.
"""

from __future__ import annotations

import ipaddress

_PREFIX = "a=candidate:"


def with_public_address(sdp: str, address: str) -> str:
    """``sdp`` with a twin at ``address`` after every host candidate of its family."""
    public = ipaddress.ip_address(address)
    lines = sdp.split("\r\n")
    out: list[str] = []
    twins = 0
    for line in lines:
        out.append(line)
        twin = _twin(line, public, twins)
        if twin is not None:
            out.append(twin)
            twins += 1
    return "\r\n".join(out)


def _twin(
    line: str, public: ipaddress.IPv4Address | ipaddress.IPv6Address, index: int
) -> str | None:
    if not line.startswith(_PREFIX):
        return None
    fields = line[len(_PREFIX) :].split()
    # foundation component transport priority address port "typ" type [extensions]
    if len(fields) < 8 or fields[6] != "typ" or fields[7] != "host":
        return None
    try:
        local = ipaddress.ip_address(fields[4])
        priority = int(fields[3])
    except ValueError:  # an mDNS name or a malformed line: nothing to twin
        return None
    if local.version != public.version or local == public:
        return None
    foundation = f"{fields[0][:24]}pub{index}"  # its own foundation (at most 32 chars)
    twin = [foundation, fields[1], fields[2], str(max(priority - 1, 0)), str(public), *fields[5:]]
    return _PREFIX + " ".join(twin)
