"""lipstream as a WHIP publisher: a session sent to a media server that takes WHIP.

Where a caller's :class:`~streaming.webrtc.peer.Peer` answers an offer, a
:class:`Publisher` makes one (``docs/design/broadcast.md`` §21): H.264 video and Opus
audio, send-only, from the session's tracks on its clock (a viewer's media: the
session's own payloads, never encoded again), with everything gathered in it (no
trickle). Its owner posts the offer (:mod:`streaming.broadcast.whip_out`) and hands the
answer to :meth:`Publisher.accept`, which installs, before media flows, what a viewer's
connection has: our RTP send (§20) and the link (§19: pacing, NACK and RTX, the
estimate from the media server's feedback). An encoder object takes the media
server's keyframe requests to the session's encoder; it encodes nothing.
"""

from __future__ import annotations

import asyncio
import logging

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from streaming.exceptions import OfferError
from streaming.link import LinkController
from streaming.webrtc.call_link import open_link
from streaming.webrtc.h264_sender import install_encoder, negotiated_codec, prefer_h264
from streaming.webrtc.peer import CallTasks, PeerMedia, PeerState
from streaming.webrtc.tracks import AvatarAudioTrack, AvatarVideoTrack
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)


class Publisher:
    """One WHIP publication of a session's media (module doc)."""

    def __init__(
        self, media: PeerMedia, encoders: EncoderFactory, tasks: CallTasks, config: RTCConfiguration
    ) -> None:
        self._pc = RTCPeerConnection(config)
        self._tasks = tasks
        self._media = media
        self._encoders = encoders
        self._video = AvatarVideoTrack(
            media.clock, media.fps, media.video, tasks.fail, join_late=True
        )
        self._audio = AvatarAudioTrack(media.clock, media.audio, tasks.fail, join_late=True)
        self.link: LinkController | None = None
        self._state = PeerState.NEW
        self.connected = asyncio.Event()
        self._pc.on(
            "connectionstatechange",
            lambda: asyncio.get_running_loop().call_soon(self._state_changed),
        )

    @property
    def state(self) -> PeerState:
        return self._state

    @property
    def frames_sent(self) -> int:
        return self._video.frames_sent

    async def offer(self) -> str:
        """The publication's offer, every candidate gathered."""
        video = self._pc.addTransceiver(self._video, direction="sendonly")
        if not prefer_h264(video):
            raise OfferError("this aiortc offers no H.264: nothing to publish with")
        self._pc.addTransceiver(self._audio, direction="sendonly")
        await self._pc.setLocalDescription(await self._pc.createOffer())
        description = self._pc.localDescription
        return description.sdp if description is not None else ""

    async def accept(self, answer: str) -> None:
        """Apply the media server's answer; ``OfferError`` if it is not one we can send
        to (no H.264 taken, a malformed answer)."""
        pc = self._pc
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        except Exception as exc:  # aiortc raises many types on a bad SDP
            raise OfferError(f"the media server's answer cannot be applied: {exc!r}"[:300]) from exc
        video = next(t for t in pc.getTransceivers() if t.sender.track is self._video)
        audio = next((t for t in pc.getTransceivers() if t.sender.track is self._audio), None)
        codec = negotiated_codec(video)
        if codec is None or codec.mimeType.lower() != "video/h264":
            raise OfferError("the media server did not take H.264 video")
        media = self._media
        encoder = self._encoders.create(*media.frame_size, media.fps)
        install_encoder(video.sender, encoder, codec)
        self._video.encode_with(encoder)
        offer = pc.localDescription.sdp if pc.localDescription is not None else ""
        self.link, _ = open_link(
            video, codec, encoder, offer=offer, answer=answer, fps=media.fps, audio=audio,
            on_audio_loss=None,
        )  # fmt: skip
        self._tasks.spawn("link", self.link.run())

    def _state_changed(self) -> None:
        state = self._pc.connectionState
        if state == "connected":
            self._state = PeerState.CONNECTED
            self.connected.set()
        elif state == "failed":
            self._state = PeerState.FAILED
            self._tasks.end("connection failed")
        elif state == "closed":
            self._state = PeerState.CLOSED
            self._tasks.end("connection closed")
        elif state == "connecting":
            self._state = PeerState.CONNECTING

    async def close(self) -> None:
        self._video.stop()
        self._audio.stop()
        try:
            async with asyncio.timeout(5.0):
                await self._pc.close()
        except (TimeoutError, Exception):  # a half-made connection may raise on close
            logger.warning("closing a WHIP publication's connection failed", exc_info=True)
        self._state = PeerState.CLOSED
