"""One caller's peer connection, and the one object that owns it.

A :class:`Peer` answers the caller's offer and holds the ``RTCPeerConnection`` for the
rest of the call; nothing else in lipstream touches it (``docs/design/map.md`` §1,
``docs/design/webrtc.md`` §6). It owns:

- **the answer**: the avatar's tracks (:class:`~streaming.webrtc.tracks.AvatarVideoTrack`,
  :class:`~streaming.webrtc.tracks.AvatarAudioTrack` when the offer has an audio
  section), H.264 preferred when the caller can decode it, the server as the DTLS
  server, the caller's Opus decoded on arrival into the call's mixer
  (:mod:`~streaming.webrtc.audio_receive`) and taken from the socket's callback
  (:mod:`~streaming.webrtc.rtp_receive`), and our H.264 encoder installed on the video
  sender;
- **its state**, as a :class:`PeerState`, and what ends the call from this side: the
  connection failed (with the DTLS cause when there is one) or closed;
- **the figures the session reports**: packets received from the caller, the video
  encoder's target bitrate, what each track has sent;
- **the data channel** a caller opens for the session's events
  (:mod:`~streaming.webrtc.data_channel`);
- **the call's link** (``webrtc/call_link.py``, ``docs/design/link.md`` §19): every
  packet in and out passes through it; the answer asks for Opus in-band FEC.

Its tasks (received tracks drained, data channels served) are the call's, spawned
through the :class:`CallTasks` it is given, so they end the call by the session's one
rule when they fail (§7).

Why one module of under 500 lines: it is the one place that holds the
``RTCPeerConnection``, so all a connection does for a call reads in one file.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import av
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from streaming.audio_rates import OUT_RATE
from streaming.exceptions import OfferError
from streaming.link import LinkController
from streaming.webrtc.answer_sdp import with_opus_params
from streaming.webrtc.audio_receive import ArrivalOrderAudioBuffer
from streaming.webrtc.call_link import open_link
from streaming.webrtc.compat import (
    DtlsFailure,
    answer_as_dtls_server,
    close_peer_connection,
    install_audio_receive_buffer,
    intercept_datagrams,
    negotiated_codecs,
    sender_encoder,
)
from streaming.webrtc.data_channel import (
    LABEL,
    MAX_EVENT_CHANNELS,
    EventChannel,
    serve_data_channel,
)
from streaming.webrtc.h264_sender import install_encoder, negotiated_codec, prefer_h264
from streaming.webrtc.offer_check import OfferInfo
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.rtp_receive import DirectReceive
from streaming.webrtc.tracks import (
    AudioQuiet,
    AvatarAudioTrack,
    AvatarVideoTrack,
    PacketSource,
    VideoSource,
)
from streaming.webrtc.video_encoder import EncoderFactory

logger = logging.getLogger(__name__)


class PeerState(enum.StrEnum):
    """Where the connection is (aiortc's ``connectionState``, as a value of our own)."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    FAILED = "failed"
    CLOSED = "closed"


class CallTasks(Protocol):
    """The call's owner of tasks and its one failure rule
    (:class:`~streaming.live.tasks.StageTasks`)."""

    def spawn(self, stage: str, coro: Coroutine[Any, Any, str | None]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of ``stage``; its end ends the call (§7)."""
        ...

    def fail(self, stage: str, exc: BaseException) -> None:
        """``stage`` failed with ``exc`` outside a task: the call ends."""
        ...

    def end(self, reason: str) -> None:
        """The call ends, for ``reason``."""
        ...


@dataclass(frozen=True)
class PeerMedia:
    """What the call sends, paced by ``clock``, and where what it receives goes.

    ``video`` gives frame ``n`` of a ``frame_size`` avatar at ``fps``; ``audio`` gives
    chunk ``n``'s Opus packet; ``caller_audio`` takes the caller's audio as float32
    48 kHz mono, as it arrives, and ``caller_concealment`` (if given) is told how to make
    up the caller's audio when a packet is late (the receive buffer's
    :meth:`~streaming.webrtc.audio_receive.ArrivalOrderAudioBuffer.conceal`);
    ``audio_loss`` hears the share of our audio packets the caller reports lost (the
    Opus encoder adds FEC for it); with ``dtx`` the answer asks the caller for Opus DTX
    and a caller that asks for it gets the avatar's silence as DTX, its track sleeping
    through what ``audio_quiet`` says is silence (:mod:`~streaming.webrtc.dtx`); with
    ``join_late`` (a viewer of a running session) the tracks start at the slot due when
    media starts to flow. Without ``send`` (a WHIP publisher) the peer only receives: its
    audio goes to ``caller_audio``, any video it offers is declined (``inactive``), and
    the tracks are pulled by someone else.
    """

    clock: SessionClock
    fps: int
    frame_size: tuple[int, int]
    video: VideoSource
    audio: PacketSource
    caller_audio: Callable[[np.ndarray], None]
    caller_concealment: Callable[[Callable[[int], np.ndarray | None]], None] | None = None
    audio_loss: Callable[[float], None] | None = None
    audio_quiet: AudioQuiet | None = None
    dtx: bool = False
    join_late: bool = False
    send: bool = True


@dataclass(frozen=True)
class SentMedia:
    """What the tracks have sent: video frames and skipped slots, and the next slot of
    each track (``audio_next`` None when the caller did not negotiate audio)."""

    frames_sent: int
    frames_skipped: int
    video_next: int
    audio_next: int | None
    audio_skipped: int = 0  # 20 ms audio slots skipped because the track fell behind


def transport_packets(stats: Iterable[Any]) -> int:
    """Packets received on the transports among aiortc's ``getStats()`` values (the
    per-stream counts would count the same packets again, and only media)."""
    return sum(getattr(s, "packetsReceived", 0) for s in stats if s.type == "transport")


def _unanswerable(exc: Exception) -> OfferError:
    # aiortc raises many types on a bad SDP (docs/design/webrtc.md §6)
    return OfferError(f"the offer cannot be answered: {exc!r}"[:500])


class Peer:
    """A caller's peer connection (module doc); made by :meth:`answer`."""

    def __init__(
        self,
        session_id: str,
        pc: RTCPeerConnection,
        media: PeerMedia,
        tasks: CallTasks,
        *,
        send_audio: bool,
    ) -> None:
        self.session_id = session_id
        self._pc = pc
        self._tasks = tasks
        late = media.join_late
        self._video = AvatarVideoTrack(
            media.clock, media.fps, media.video, tasks.fail, join_late=late
        )
        self._audio = (
            AvatarAudioTrack(media.clock, media.audio, tasks.fail, join_late=late)
            if send_audio
            else None
        )
        self._dtls = DtlsFailure()
        self._state = PeerState.NEW
        self._channels: list[asyncio.Task[Any]] = []  # data channels being served
        self.video_codec: str | None = None  # the negotiated one, once answered
        self.link: LinkController | None = None  # the H.264 call's link, once answered
        self._receives: list[DirectReceive] = []  # one per transport, once answered
        self._answer = ""

    @classmethod
    async def answer(
        cls,
        session_id: str,
        sdp: str,
        offer: OfferInfo,
        *,
        config: RTCConfiguration,
        encoders: EncoderFactory,
        media: PeerMedia,
        events: EventChannel,
        tasks: CallTasks,
    ) -> Peer:
        """Answer a checked offer; the call's media flows once ICE connects.

        Raises ``OfferError`` for an offer aiortc cannot answer (the connection is
        closed again; tasks it spawned are the caller's to stop).
        """
        pc = RTCPeerConnection(config)
        peer = cls(session_id, pc, media, tasks, send_audio="audio" in offer.kinds)
        try:
            await peer._negotiate(sdp, offer, encoders, media, events)
        except BaseException:
            await peer.close()
            raise
        return peer

    async def _negotiate(
        self,
        sdp: str,
        offer: OfferInfo,
        encoders: EncoderFactory,
        media: PeerMedia,
        events: EventChannel,
    ) -> None:
        pc = self._pc
        if not media.send:
            await self._negotiate_receiving(sdp, media)
            return
        # Send only what the offer has a section for (aiortc cannot answer an extra one).
        video_sender = pc.addTrack(self._video)
        audio_sender = pc.addTrack(self._audio) if self._audio is not None else None
        video = next(t for t in pc.getTransceivers() if t.sender is video_sender)
        audio = next((t for t in pc.getTransceivers() if t.sender is audio_sender), None)
        if offer.offers_h264:  # else aiortc negotiates VP8
            prefer_h264(video)
        pc.on("track", lambda track: self._receive(track, media.caller_audio))
        pc.on("datachannel", lambda channel: self._serve_events(channel, events))
        # A step later: a failed DTLS transport tells its own listeners (DtlsFailure, which
        # finds the cause) after aiortc's, which is what changes the connection's state.
        pc.on(
            "connectionstatechange",
            lambda: asyncio.get_running_loop().call_soon(self._state_changed),
        )
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:
            raise _unanswerable(exc) from exc
        answer_as_dtls_server(pc)  # a=setup:passive to actpass (docs/design/webrtc.md §6)
        try:
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            raise _unanswerable(exc) from exc
        self._dtls.watch(pc)
        if not pc.getTransceivers() or all(t.mid is None for t in pc.getTransceivers()):
            raise OfferError("the offer has no audio or video section")
        for transceiver in pc.getTransceivers():  # before media flows (§2)
            if transceiver.kind == "audio":
                self._decode_on_arrival(transceiver, media)
        transports = {t.receiver.transport for t in pc.getTransceivers()}
        self._receives = [  # the caller's RTP from the socket's callback (§20)
            DirectReceive(functools.partial(intercept_datagrams, transport))
            for transport in transports
        ]
        answer = pc.localDescription.sdp if pc.localDescription is not None else ""
        negotiated = negotiated_codec(video)
        if negotiated is not None:
            self.video_codec = negotiated.mimeType
            encoder = encoders.create(*media.frame_size, media.fps)
            if install_encoder(video_sender, encoder, negotiated):
                self._video.encode_with(encoder)
                self.link, answer = open_link(
                    video,
                    negotiated,
                    encoder,
                    offer=sdp,
                    answer=answer,
                    fps=media.fps,
                    audio=audio,
                    on_audio_loss=media.audio_loss,
                )
                self._tasks.spawn("link", self.link.run())  # ends with the call
        if self._audio is not None:
            if media.dtx and offer.opus_dtx:
                self._audio.send_dtx(media.audio_quiet)
            answer = with_opus_params(answer, dtx=media.dtx)
        self._answer = answer

    async def _negotiate_receiving(self, sdp: str, media: PeerMedia) -> None:
        """A publisher's offer (module doc): its audio decoded into ``caller_audio``, its
        video declined, nothing sent."""
        pc = self._pc
        pc.on("track", lambda track: self._receive(track, media.caller_audio))
        pc.on(
            "connectionstatechange",
            lambda: asyncio.get_running_loop().call_soon(self._state_changed),
        )
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            for transceiver in pc.getTransceivers():
                transceiver.direction = "recvonly" if transceiver.kind == "audio" else "inactive"
            answer_as_dtls_server(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            raise _unanswerable(exc) from exc
        self._dtls.watch(pc)
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "audio":
                self._decode_on_arrival(transceiver, media)
        transports = {t.receiver.transport for t in pc.getTransceivers()}
        self._receives = [
            DirectReceive(functools.partial(intercept_datagrams, transport))
            for transport in transports
        ]
        answer = pc.localDescription.sdp if pc.localDescription is not None else ""
        self._answer = with_opus_params(answer, dtx=media.dtx)

    def _decode_on_arrival(self, transceiver: RTCRtpTransceiver, media: PeerMedia) -> None:
        opus = [
            c.payloadType
            for c in negotiated_codecs(transceiver)
            if c.name.lower() == "opus" and c.payloadType is not None
        ]

        def failed(exc: BaseException) -> None:
            self._tasks.fail("audio receive", exc)

        buffer = ArrivalOrderAudioBuffer(media.caller_audio, opus, on_failure=failed)
        install_audio_receive_buffer(transceiver, buffer)
        if media.caller_concealment is not None and opus:
            media.caller_concealment(buffer.conceal)

    def _receive(self, track: MediaStreamTrack, into: Callable[[np.ndarray], None]) -> None:
        """A track the caller sends: drained (aiortc's queues are unbounded); audio in a
        codec the receive buffer does not decode itself (not Opus) goes ``into`` the mixer."""
        stage = "audio receive" if track.kind == "audio" else "video receive"
        self._tasks.spawn(stage, _consume(track, into))

    def _serve_events(self, channel: RTCDataChannel, events: EventChannel) -> None:
        if channel.label != LABEL:
            return
        # A caller can open channels on its SCTP association for ever: each served one
        # is a task and an event listener, so only a few at a time are.
        self._channels = [task for task in self._channels if not task.done()]
        if len(self._channels) >= MAX_EVENT_CHANNELS:
            logger.info(
                "data channel refused: session=%s already serves %d; closing it",
                self.session_id,
                len(self._channels),
            )
            channel.close()
            return
        self._channels.append(
            self._tasks.spawn("data channel", serve_data_channel(channel, events))
        )

    def _state_changed(self) -> None:
        state = self._pc.connectionState
        if state == "connecting":
            self._state = PeerState.CONNECTING
        elif state == "connected":
            self._state = PeerState.CONNECTED
        elif state == "failed":
            self._state = PeerState.FAILED
            cause = self._dtls.cause
            if cause is not None:
                logger.warning("DTLS handshake failed: session=%s cause=%s", self.session_id, cause)
            self._tasks.end("connection failed" if cause is None else f"DTLS failed: {cause}")
        elif state == "closed":
            self._state = PeerState.CLOSED
            self._tasks.end("connection closed")

    # -- figures ----------------------------------------------------------------------

    @property
    def audio_track(self) -> AvatarAudioTrack | None:
        """The avatar's audio track, when the caller negotiated audio."""
        return self._audio

    @property
    def answer_sdp(self) -> str:
        """The SDP answer to the caller's offer (aiortc's, with what the link asks for)."""
        return self._answer

    @property
    def state(self) -> PeerState:
        return self._state

    @property
    def ice_connected(self) -> bool:
        """Whether ICE found a path (whether or not DTLS then completed)."""
        return self._pc.iceConnectionState in ("connected", "completed")

    @property
    def receives(self) -> tuple[DirectReceive, ...]:
        """How the caller's RTP is taken in, per transport (its counts)."""
        return tuple(self._receives)

    async def packets_received(self) -> int:
        """Packets (DTLS, SRTP, SRTCP) received from the caller on its transports so far."""
        return transport_packets((await self._pc.getStats()).values())

    @property
    def target_bitrate_bps(self) -> int | None:
        """The video encoder's target bitrate, once aiortc (or we) made the encoder."""
        for sender in self._pc.getSenders():
            if sender.track is self._video:
                rate = getattr(sender_encoder(sender), "target_bitrate", None)
                return rate if isinstance(rate, int) else None
        return None

    def sent(self) -> SentMedia:
        """What the tracks have sent so far."""
        video, audio = self._video, self._audio
        sends_audio = audio is not None and any(s.track is audio for s in self._pc.getSenders())
        return SentMedia(
            frames_sent=video.frames_sent,
            frames_skipped=video.frames_skipped,
            video_next=video.next_index,
            audio_next=audio.next_index if sends_audio and audio is not None else None,
            audio_skipped=audio.chunks_skipped if audio is not None else 0,
        )

    # -- lifetime ---------------------------------------------------------------------

    async def flush_events(self, timeout_s: float) -> None:
        """Give the data channels up to ``timeout_s`` to send what they hold (the session
        ended: ``session_ended`` goes out before the connection closes)."""
        channels = [task for task in self._channels if not task.done()]
        if channels:
            await asyncio.wait(channels, timeout=timeout_s)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the tracks and close the connection, within ``timeout_s``."""
        self._video.stop()
        if self._audio is not None:
            self._audio.stop()
        for receive in self._receives:
            await receive.close()
        try:
            async with asyncio.timeout(timeout_s):
                await close_peer_connection(self._pc)
        except TimeoutError:
            logger.warning(
                "closing the peer connection took over %.0f s; abandoned: session=%s",
                timeout_s,
                self.session_id,
            )
        except Exception:  # aiortc can raise from close on a half-set-up connection
            logger.warning(
                "closing the peer connection failed: session=%s", self.session_id, exc_info=True
            )
        self._state = PeerState.CLOSED


async def _consume(track: MediaStreamTrack, into: Callable[[np.ndarray], None]) -> None:
    """Drain a received track; its audio, resampled to 48 kHz mono, goes ``into``."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=OUT_RATE)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not isinstance(frame, av.AudioFrame):
            continue
        for out in resampler.resample(frame):
            into(out.to_ndarray().reshape(-1))
