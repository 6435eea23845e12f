"""The ICE servers the server's own peer connections use."""

from __future__ import annotations

import secrets

from aiortc import RTCConfiguration, RTCIceServer

from config.settings import Settings
from streaming.webrtc.turn import turn_server


def ice_configuration(settings: Settings) -> RTCConfiguration:
    """ICE servers from the settings; none by default (``None`` would mean Google's STUN)."""
    servers = [
        RTCIceServer(
            urls=list(server.urls),
            username=server.username,
            credential=server.credential.get_secret_value() if server.credential else None,
        )
        for server in settings.server.ice_servers
    ]
    # A server behind NAT relays too. Its own id per connection: coturn's per-user quota
    # and logs then tell one call's allocation from another's.
    turn = turn_server(settings.turn, f"lipstream-server-{secrets.token_hex(6)}")
    if turn is not None:
        urls, username, credential = turn
        servers.append(RTCIceServer(urls=urls, username=username, credential=credential))
    return RTCConfiguration(iceServers=servers)
