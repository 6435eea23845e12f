"""Closing a peer connection without leaving an ICE consent task behind.

aioice (0.13) starts its consent-freshness task (RFC 7675) at the end of
``Connection.connect()``, and aiortc runs that ``connect()`` in a task that
``RTCPeerConnection.close()`` does not cancel. A call hung up while ICE is finishing
(the caller hangs up at once, an ICE timeout, a DELETE during set-up) therefore gets its
consent task created *after* the connection closed: nothing cancels it, and it wakes
every ~5 s for the life of the process, holding the connection's objects. Measured here:
one such task per side for every call hung up during ICE (tests/test_cycles.py).

:func:`close_peer_connection` makes a consent check that starts after the close a no-op
before closing; a check already running is cancelled by aioice's own ``close()``.
"""

from __future__ import annotations

from typing import Any

from aiortc import RTCPeerConnection


async def _no_consent_checks() -> None:
    """Stands in for ``Connection.query_consent`` once the connection is closing."""


def _ice_connections(pc: RTCPeerConnection) -> list[Any]:
    """The aioice connections under ``pc``'s transports (one per transport, BUNDLE or not)."""
    ice_transports = [t.receiver.transport.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        ice_transports.append(pc.sctp.transport.transport)
    connections: dict[int, Any] = {}
    for ice_transport in ice_transports:
        # Private in aiortc; if a release renames it, closing just loses this workaround.
        connection = getattr(ice_transport, "_connection", None)
        if connection is not None:
            connections[id(connection)] = connection
    return list(connections.values())


async def close_peer_connection(pc: RTCPeerConnection) -> None:
    """``pc.close()``, plus: no ICE consent task may start on it afterwards."""
    for connection in _ice_connections(pc):
        connection.query_consent = _no_consent_checks
    await pc.close()
