"""The tests' WHEP viewer: a bare aiortc peer connection that posts its offer as
``application/sdp`` (as any WHEP player does) and records what it decodes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, pack_remb_fci


@dataclass
class Watched:
    """What a viewer decoded: each picture's luma digest (:func:`luma_digest`) in order,
    and audio samples."""

    pictures: list[str] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    audio_samples: int = 0
    audio_peak: float = 0.0


def luma_digest(luma: np.ndarray) -> str:
    """A decoded picture's Y plane as a short digest (equal pictures, equal digests)."""
    return hashlib.sha1(np.ascontiguousarray(luma).tobytes()).hexdigest()


class Viewer:
    """One WHEP viewer of a session (``POST /sessions/{id}/whep``)."""

    def __init__(
        self,
        client: TestClient[Any, Any] | ClientSession,
        session_id: str,
        *,
        own_remb: bool = True,
    ) -> None:
        """``own_remb=False`` switches aiortc's own bandwidth estimator off from the start,
        so the only REMBs the server gets are the test's (:meth:`send_remb`): aiortc's
        estimate follows how fast this process reads its packets, which a loaded machine
        drags down."""
        self.own_remb = own_remb
        self.client = client
        self.session_id = session_id
        self.pc = RTCPeerConnection()
        self.watched = Watched()
        self.location = ""
        self.links: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def offer(self, *, audio: bool = True) -> str:
        """The viewer's offer, gathered (receive-only video, and audio if ``audio``)."""
        video = self.pc.addTransceiver("video", direction="recvonly")
        if not self.own_remb:
            _quiet_estimator(video.receiver)
        if audio:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def watch(self, *, audio: bool = True, headers: dict[str, str] | None = None) -> None:
        """Post the offer and apply the answer (the test fails on anything but 201)."""
        sdp = await self.offer(audio=audio)
        response = await self.client.post(
            f"/sessions/{self.session_id}/whep",
            data=sdp,
            headers={"Content-Type": "application/sdp", **(headers or {})},
        )
        answer = await response.text()
        assert response.status == 201, answer
        assert response.content_type == "application/sdp"
        self.location = response.headers["Location"]
        self.links = response.headers.getall("Link", [])
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        watched = self.watched
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if isinstance(frame, av.VideoFrame):
                plane = frame.to_ndarray(format="yuv420p")[: frame.height]
                watched.pictures.append(luma_digest(plane))
                watched.sizes.append((frame.width, frame.height))
            elif isinstance(frame, av.AudioFrame):
                pcm = frame.to_ndarray()
                watched.audio_samples += frame.samples
                watched.audio_peak = max(watched.audio_peak, float(abs(pcm).max()) / 32768)

    async def send_remb(self, bitrate: int) -> None:
        """Tell the server this viewer's link carries ``bitrate`` (a REMB), in place of
        what aiortc's own estimator would say (it is switched off here)."""
        receiver = next(t.receiver for t in self.pc.getTransceivers() if t.kind == "video")
        _quiet_estimator(receiver)
        sources = receiver.getSynchronizationSources()
        if not sources:
            return
        await receiver._send_rtcp(  # type: ignore[attr-defined]
            RtcpPsfbPacket(
                fmt=RTCP_PSFB_APP,
                ssrc=receiver._RTCRtpReceiver__rtcp_ssrc,  # type: ignore[attr-defined]
                media_ssrc=0,
                fci=pack_remb_fci(bitrate, [sources[0].source]),
            )
        )

    async def leave(self) -> int:
        """``DELETE`` the viewer's ``Location``; the status."""
        response = await self.client.delete(self.location)
        return response.status

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _quiet_estimator(receiver: RTCRtpReceiver) -> None:
    """No more REMBs of aiortc's own from ``receiver`` (its estimator is private)."""
    receiver._RTCRtpReceiver__remote_bitrate_estimator = None  # type: ignore[attr-defined]
