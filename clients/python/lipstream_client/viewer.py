"""Watching a session with aiortc (WHEP): :func:`watch` opens a viewer, :class:`Viewer` holds it.

A viewer receives what the session sends its caller (the avatar's H.264 video, its voice
and, on a data channel labelled ``lipstream``, its events) and sends nothing. Its offer
is receive-only, with ICE gathered completely (the server takes no trickled candidates),
``POST``-ed as ``application/sdp`` to ``/sessions/{id}/whep`` (RFC 9725's shape); the
answer's ``Location`` is the viewer, ``DELETE``-d to leave. Any session can be watched:
one made by :meth:`Client.create_session`, or somebody's call. What a viewer receives is
drained as a call's is (:class:`~lipstream_client.call.Receiver`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, ClassVar

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from lipstream_client.call import Receiver, rtc_ice_servers
from lipstream_client.http import Client
from lipstream_client.models import IceServer, QueueSizes

logger = logging.getLogger(__name__)


class Viewer(Receiver):
    """One viewer of a session: its received media and events (:class:`Receiver`).

    Made by :func:`watch`; ``async with`` leaves on exit. Leaving ends this viewer alone:
    the session goes on until :meth:`Client.hang_up` (or its caller) ends it, and its
    end ends the viewer (``session_ended`` arrives on the data channel first).
    ``viewer_id`` and ``location`` (an absolute URL) name the viewer on the server;
    ``ice_servers`` are those the server listed for it (its answer's ``Link`` headers).
    """

    kind: ClassVar[str] = "viewer"

    def __init__(
        self,
        client: Client,
        pc: RTCPeerConnection,
        session_id: str,
        *,
        fps: int,
        queues: QueueSizes,
        owns_client: bool,
    ) -> None:
        super().__init__(client, pc, fps=fps, queues=queues, owns_client=owns_client)
        self.session_id = session_id
        self.viewer_id = ""
        self.location = ""
        self.ice_servers: tuple[IceServer, ...] = ()

    def _label(self) -> str:
        return f"viewer {self.viewer_id or '(not answered)'} of session {self.session_id}"

    async def _offer(self) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())  # gathers all of ICE
        answer = await self.client.whep_offer(self.session_id, self.pc.localDescription.sdp)
        self.viewer_id = answer.viewer_id
        self.location = answer.location
        self.ice_servers = answer.ice_servers
        logger.info("%s: offer answered", self._label())
        await self.pc.setRemoteDescription(RTCSessionDescription(answer.sdp, "answer"))

    async def state(self) -> dict[str, Any]:
        """:meth:`Client.state` of the session watched (its ``viewers`` count this one)."""
        return await self.client.state(self.session_id)

    # -- the end ----------------------------------------------------------------------

    async def __aenter__(self) -> Viewer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.leave()

    async def leave(self) -> None:
        """Stop watching: ``DELETE`` the viewer (one already gone is fine), close the peer
        connection, stop the receive tasks. The session goes on."""
        location = self.location
        await self._end((lambda: self.client.end_viewer(location)) if location else None)


async def watch(
    client: Client,
    session_id: str,
    *,
    pc: RTCPeerConnection | None = None,
    receive_audio: bool = True,
    data_channel: bool = True,
    ice_servers: Sequence[IceServer] | None = None,
    queues: QueueSizes | None = None,
    fps: int = 25,
) -> Viewer:
    """Watch the session ``session_id`` on ``client``'s server, without waiting for ICE
    (``await viewer.wait_connected(timeout_s)`` waits for media and the data channel).

    The offer is receive-only: video, audio when ``receive_audio``, and the events data
    channel when ``data_channel``. ``pc`` is a peer connection of your own, with its own
    ICE configuration (then ``ice_servers`` is not used); otherwise ``ice_servers``
    default to the server's ``GET /webrtc-config`` list, which has the servers of the
    answer's ``Link`` headers: the offer carries every candidate, so its ICE servers
    must be known before it is sent. ``fps`` and ``queues`` are as for
    :func:`lipstream_client.connect`; ``client`` stays open after the viewer. A refused
    offer (:class:`SessionNotFound`, :class:`TooManyViewers`, :class:`Unauthorized`,
    :class:`BadRequest`) closes what was opened and raises.
    """
    queues = queues or QueueSizes()
    if pc is None:
        if ice_servers is None:
            ice_servers = (await client.webrtc_config()).ice_servers
        pc = RTCPeerConnection(RTCConfiguration(iceServers=rtc_ice_servers(ice_servers)))
    viewer = Viewer(client, pc, session_id, fps=fps, queues=queues, owns_client=False)
    try:
        pc.addTransceiver("video", direction="recvonly")
        if receive_audio:
            pc.addTransceiver("audio", direction="recvonly")
        if data_channel:
            viewer._open_events_channel(queues.events)
        await viewer._offer()
    except BaseException:
        await viewer.leave()
        raise
    return viewer
