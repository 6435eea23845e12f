"""The peer owner against a real aiortc caller in the same process.

:class:`~streaming.webrtc.peer.Peer` answers the offer (H.264 preferred, the server as
DTLS server, our encoder installed, audio only when offered), keeps the connection's
state as a :class:`~streaming.webrtc.peer.PeerState`, reports its figures, and tells
the call's tasks when the connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from config.settings import VideoSettings
from streaming.exceptions import OfferError
from streaming.live.events import SessionEvents
from streaming.webrtc.data_channel import LABEL, MAX_EVENT_CHANNELS, EventChannel
from streaming.webrtc.offer_check import OfferInfo, OfferLimits, check_offer
from streaming.webrtc.pacing import SessionClock
from streaming.webrtc.peer import Peer, PeerMedia, PeerState
from streaming.webrtc.tracks import SILENCE, stamped, video_frame
from streaming.webrtc.video_encoder import EncoderFactory
from tests.live_calls import TIMEOUT_S, until

SIZE = (64, 48)


@dataclass
class Tasks:
    """The call's tasks, as the peer sees them: what it spawned and how the call ended."""

    spawned: list[tuple[str, asyncio.Task[Any]]] = field(default_factory=list)
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)

    def spawn(self, stage: str, coro: Coroutine[Any, Any, str | None]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self.spawned.append((stage, task))
        return task

    def fail(self, stage: str, exc: BaseException) -> None:
        self.failures.append((stage, exc))

    def end(self, reason: str) -> None:
        self.ends.append(reason)

    async def stop(self) -> None:
        for _, task in self.spawned:
            task.cancel()
        await asyncio.gather(*(t for _, t in self.spawned), return_exceptions=True)


class Video:
    """A grey avatar; records the frames handed to aiortc."""

    def __init__(self) -> None:
        self.sent_indices: list[int] = []

    async def frame_for(self, index: int) -> np.ndarray:
        width, height = SIZE
        return np.full((height * 3 // 2, width), 128, np.uint8)

    async def packet_for(self, index: int, encoder: Any) -> av.Packet[Any]:
        return encoder.encode_packet(video_frame(await self.frame_for(index), index, 25))

    def sent(self, index: int) -> None:
        self.sent_indices.append(index)


@dataclass
class Rig:
    peer: Peer
    caller: RTCPeerConnection
    tasks: Tasks
    heard: list[np.ndarray]
    video: Video


async def _offer(caller: RTCPeerConnection, *, audio: bool, h264: bool = True) -> str:
    if audio:
        caller.addTransceiver("audio", direction="recvonly")
    video = caller.addTransceiver("video", direction="recvonly")
    if not h264:
        from aiortc import RTCRtpReceiver

        codecs = RTCRtpReceiver.getCapabilities("video").codecs
        video.setCodecPreferences([c for c in codecs if c.mimeType.lower() == "video/vp8"])
    await caller.setLocalDescription(await caller.createOffer())
    return str(caller.localDescription.sdp)


async def _answer(
    sdp: str,
    tasks: Tasks,
    video: Video,
    heard: list[np.ndarray],
    offer: OfferInfo | None = None,
    events: EventChannel | None = None,
) -> Peer:
    offer = offer or check_offer(sdp, OfferLimits())
    media = PeerMedia(
        clock=SessionClock(0.1),
        fps=25,
        frame_size=SIZE,
        video=video,
        audio=lambda index: stamped(SILENCE, index),
        caller_audio=heard.append,
    )
    events = events or EventChannel(listen=_no_events, answer=lambda message, reply: None)
    return await Peer.answer(
        "session-under-test",
        sdp,
        offer,
        config=RTCConfiguration(iceServers=[]),
        encoders=EncoderFactory(VideoSettings(preset="ultrafast")),
        media=media,
        events=events,
        tasks=tasks,
    )


def _no_events() -> Any:
    raise AssertionError("this test opens no data channel")


@contextlib.asynccontextmanager
async def _call(
    *,
    audio: bool,
    h264: bool = True,
    events: EventChannel | None = None,
    channels: list[RTCDataChannel] | None = None,
) -> AsyncIterator[Rig]:
    """A call; with ``channels``, the caller opens a ``lipstream`` data channel in its
    offer and appends it there."""
    caller = RTCPeerConnection()
    if channels is not None:
        channels.append(caller.createDataChannel(LABEL))
    tasks, video = Tasks(), Video()
    heard: list[np.ndarray] = []
    frames: list[Any] = []

    @caller.on("track")
    def on_track(track: Any) -> None:
        async def drain() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    frames.append(await track.recv())

        tasks.spawned.append(("caller drain", asyncio.create_task(drain())))

    sdp = await _offer(caller, audio=audio, h264=h264)
    peer = await _answer(sdp, tasks, video, heard, events=events)
    try:
        await caller.setRemoteDescription(RTCSessionDescription(sdp=peer.answer_sdp, type="answer"))
        yield Rig(peer, caller, tasks, heard, video)
    finally:
        await caller.close()
        await peer.close()
        await tasks.stop()


async def test_an_offer_with_audio_and_h264_is_answered_as_dtls_server_and_connects(
    loopback: None,
) -> None:
    async with _call(audio=True) as rig:
        assert rig.peer.video_codec is not None
        assert rig.peer.video_codec.lower() == "video/h264"
        assert "a=setup:passive" in rig.peer.answer_sdp
        assert "m=audio" in rig.peer.answer_sdp
        assert "useinbandfec=1" in rig.peer.answer_sdp  # the caller's voice carries FEC
        assert "transport-cc" not in rig.peer.answer_sdp  # aiortc offers none: REMB
        assert rig.peer.link is not None
        await until(lambda: rig.peer.state == PeerState.CONNECTED, "the call to connect")
        assert rig.peer.ice_connected
        await until(lambda: len(rig.video.sent_indices) >= 5, "frames to go out")
        assert rig.peer.target_bitrate_bps is not None  # our encoder, installed
        sent = rig.peer.sent()
        assert sent.frames_sent >= 5
        assert sent.audio_next is not None  # the audio track is negotiated and sending
        assert await rig.peer.packets_received() > 0
        assert rig.tasks.ends == []
        assert rig.tasks.failures == []


async def test_an_offer_without_audio_gets_no_audio_track(loopback: None) -> None:
    async with _call(audio=False, h264=False) as rig:
        assert "m=audio" not in rig.peer.answer_sdp
        assert rig.peer.video_codec is not None
        assert rig.peer.video_codec.lower() == "video/vp8"  # aiortc encodes VP8 itself
        await until(lambda: len(rig.video.sent_indices) >= 3, "frames to go out")
        assert rig.peer.sent().audio_next is None
        assert rig.peer.link is None  # aiortc's own encoder: no link to steer it


async def test_the_caller_leaving_ends_the_call(loopback: None) -> None:
    async with _call(audio=True) as rig:
        await until(lambda: rig.peer.state == PeerState.CONNECTED, "the call to connect")
        await rig.caller.close()
        # aiortc notices a peer that closed cleanly (DTLS close_notify) at once.
        await until(lambda: rig.tasks.ends, "the peer to end the call", timeout_s=TIMEOUT_S)
        assert rig.tasks.ends[0] in ("connection closed", "connection failed")


async def test_an_offer_aiortc_cannot_answer_is_an_offer_error() -> None:
    caller = RTCPeerConnection()
    sdp = await _offer(caller, audio=True)
    await caller.close()
    # No video codec aiortc can send: the offer check refuses this before the peer
    # sees it; past it, aiortc's own error must still come out as an OfferError (400).
    broken = sdp.replace("VP8/90000", "XV1/90000").replace("H264/90000", "XV2/90000")
    tasks = Tasks()
    info = OfferInfo(kinds=frozenset({"audio", "video"}), offers_h264=False)
    with pytest.raises(OfferError, match="cannot be answered"):
        await _answer(broken, tasks, Video(), [], info)
    # The half-made connection was closed (the peer tells it a loop step later).
    await until(lambda: tasks.ends == ["connection closed"], "the connection to close")


async def test_a_caller_gets_at_most_max_event_channels_served(loopback: None) -> None:
    hub = SessionEvents("session-under-test")
    events = EventChannel(listen=hub.listen, answer=lambda message, reply: None)
    channels: list[RTCDataChannel] = []
    async with _call(audio=False, events=events, channels=channels) as rig:
        await until(lambda: channels[0].readyState == "open", "the first channel to open")
        # Further channels on the same association, beyond what one call serves.
        channels += [rig.caller.createDataChannel(LABEL) for _ in range(MAX_EVENT_CHANNELS + 1)]
        received: list[list[str]] = [[] for _ in channels]
        for channel, inbox in zip(channels, received, strict=True):
            channel.on("message", inbox.append)

        def served() -> int:
            return sum(stage == "data channel" for stage, _ in rig.tasks.spawned)

        await until(
            lambda: (
                served() == MAX_EVENT_CHANNELS
                and sum(c.readyState == "closed" for c in channels) == len(channels) - served()
            ),
            "the extra channels to be closed",
        )
        open_ = [i for i, c in enumerate(channels) if c.readyState == "open"]
        assert len(open_) == MAX_EVENT_CHANNELS
        hub.publish("queued_ms", queued_ms=0.0, utterance=None)
        await until(lambda: all(received[i] for i in open_), "the event on every served channel")
        assert hub.listeners == MAX_EVENT_CHANNELS
