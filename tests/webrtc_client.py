"""An in-process WebRTC client for tests: offers to the server, records what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

from streaming.webrtc.compat import negotiated_codecs
from tests.live_calls import TIMEOUT_S, until


@dataclass
class Received:
    """What the client got back."""

    video_times: list[float] = field(default_factory=list)  # arrival (monotonic)
    video_pts: list[int] = field(default_factory=list)
    luma: dict[int, np.ndarray] = field(default_factory=dict)  # frame index -> Y plane
    audio_samples: int = 0
    audio_energy: list[tuple[int, float]] = field(default_factory=list)  # (pts, rms)
    video_codec: str | None = None
    size: tuple[int, int] | None = None


class Caller:
    """One call: optional microphone from a WAV file, receives video and audio.

    ``client`` is the in-process test client, or a ``ClientSession(base_url=...)`` for a
    server in another process. ``configuration`` sets ICE servers (a TURN relay).
    """

    def __init__(
        self,
        client: TestClient[object, object] | ClientSession,
        avatar: str = "demo",
        headers: dict[str, str] | None = None,
        *,
        configuration: RTCConfiguration | None = None,
    ) -> None:
        self.client = client
        self.headers = headers or {}
        self.avatar = avatar
        self.pc = RTCPeerConnection(configuration)
        self.received = Received()
        self.session_id = ""
        self.player: MediaPlayer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.keep_luma = True
        self.audio = True  # offer to receive audio
        self._first_pts: dict[str, int] = {}

    async def connect_without_answer(self) -> None:
        """Send an offer but never apply the answer: ICE can never connect."""
        self.pc.addTransceiver("video", direction="recvonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        response = await self.client.post(
            "/offer", json={"sdp": local.sdp, "type": local.type, "avatar": self.avatar}
        )
        assert response.status == 200, await response.text()
        self.session_id = (await response.json())["session_id"]

    async def connect(self, microphone: Path | None = None) -> None:
        if microphone is not None:
            self.player = MediaPlayer(str(microphone))
            self.pc.addTrack(self.player.audio)
        elif self.audio:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.pc.addTransceiver("video", direction="recvonly")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._tasks.append(asyncio.create_task(self._consume(track)))

        await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        response = await self.client.post(
            "/offer",
            json={"sdp": local.sdp, "type": local.type, "avatar": self.avatar},
            headers=self.headers,
        )
        assert response.status == 200, await response.text()
        answer = await response.json()
        self.session_id = answer["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        for transceiver in self.pc.getTransceivers():
            codecs = negotiated_codecs(transceiver)
            if transceiver.kind == "video" and codecs:
                self.received.video_codec = codecs[0].mimeType

    async def _consume(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                # RTP timestamps start at a random offset: count from the first frame,
                # which is the session's frame 0 (the server starts its clock on it).
                first = self._first_pts.setdefault(track.kind, int(frame.pts))
                pts = int(frame.pts) - first
                if isinstance(frame, av.VideoFrame):
                    r = self.received
                    r.video_times.append(time.monotonic())
                    r.video_pts.append(pts)
                    r.size = (frame.width, frame.height)
                    if self.keep_luma:
                        index = round(pts * 25 / 90_000)
                        r.luma[index] = frame.to_ndarray(format="yuv420p")[: frame.height]
                elif isinstance(frame, av.AudioFrame):
                    pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                    self.received.audio_samples += frame.samples
                    rms = float(np.sqrt(np.mean(pcm**2)))
                    self.received.audio_energy.append((pts, rms))

    def fps_since(self, seconds_ago: float) -> float:
        """Frames per second received over the last ``seconds_ago`` seconds.

        A wall-clock rate: it drops whenever the machine is busy, so tests do not assert
        on it (``tests/live_calls.py``); frame rates are measured by the benchmarks.
        """
        now = time.monotonic()
        times = [t for t in self.received.video_times if t >= now - seconds_ago]
        return len(times) / seconds_ago

    @property
    def video_indices(self) -> list[int]:
        """The session's frame index of each video frame received (25 fps), in order."""
        return [round(pts * 25 / 90_000) for pts in self.received.video_pts]

    async def wait_for_frames(self, count: int, timeout_s: float = TIMEOUT_S) -> None:
        """Wait until ``count`` video frames have arrived (fails after ``timeout_s``)."""
        await until(
            lambda: len(self.received.video_times) >= count,
            f"{count} video frames",
            timeout_s=timeout_s,
        )

    async def wait_for_media(self, seconds: float, timeout_s: float = TIMEOUT_S) -> None:
        """Wait until video, and audio if offered, reached ``seconds`` of the session's time.

        Session time is the media timestamps, not the wall clock: a busy server skips late
        slots, but the call has played this far once a frame stamped past it arrived.
        """
        r = self.received

        def reached() -> bool:
            video = bool(r.video_pts) and r.video_pts[-1] / 90_000 >= seconds
            audio = bool(r.audio_energy) and r.audio_energy[-1][0] / 48_000 >= seconds
            return video and (audio or not self.audio)

        await until(reached, f"{seconds:g} s of the call's media", timeout_s=timeout_s)

    async def hang_up(self) -> None:
        if self.session_id:
            await self.client.delete(f"/sessions/{self.session_id}", headers=self.headers)
        await self.close()

    async def close(self) -> None:
        if self.player is not None and self.player.audio is not None:
            self.player.audio.stop()
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
