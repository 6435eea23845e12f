"""The tests' WebRTC caller: :mod:`lipstream_client` calls, and this records what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.contrib.media import MediaPlayer

import lipstream_client as lc
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

    A thin layer on :mod:`lipstream_client` (:func:`lipstream_client.open_call`) that
    records what arrives for the tests. ``client`` is the in-process test client, or a
    ``ClientSession(base_url=...)`` for a server in another process. ``headers`` may carry
    ``Authorization: Bearer <token>``. ``configuration`` sets ICE servers (a TURN relay).
    ``own_remb=False`` switches aiortc's own bandwidth estimator off once the call is
    made: aiortc estimates from arrival times, and a CPU the rest of the suite loads makes
    it ask for less, which steps the call down the quality ladder. Without REMB the link
    stays at the full rate (loss-based, and loopback loses nothing): for tests whose
    subject is not the link.
    """

    def __init__(
        self,
        client: TestClient[object, object] | ClientSession,
        avatar: str = "demo",
        headers: dict[str, str] | None = None,
        *,
        configuration: RTCConfiguration | None = None,
        own_remb: bool = True,
    ) -> None:
        self.own_remb = own_remb
        self.client = client
        self.headers = headers or {}
        self.avatar = avatar
        self.pc = RTCPeerConnection(configuration)
        self.received = Received()
        self.session_id = ""
        self.player: MediaPlayer | None = None
        self.call: lc.Call | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.keep_luma = True
        self.audio = True  # offer to receive audio

    def _lipstream(self) -> lc.Client:
        """The client library on this caller's HTTP session (which it does not close)."""
        unknown = set(self.headers) - {"Authorization"}
        assert not unknown, f"Caller sends only a bearer token, not {unknown}"
        token = self.headers.get("Authorization", "").removeprefix("Bearer ") or None
        if isinstance(self.client, TestClient):
            return lc.Client(
                str(self.client.make_url("")), token=token, session=self.client.session
            )
        # A ClientSession with a base_url: paths stay relative to it.
        return lc.Client("", token=token, session=self.client)

    async def connect_without_answer(self) -> None:
        """Send an offer but never apply the answer: ICE can never connect."""
        self.pc.addTransceiver("video", direction="recvonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        answer = await self._lipstream().offer(self.pc.localDescription.sdp, self.avatar)
        self.session_id = answer.session_id

    async def connect(self, microphone: Path | None = None) -> None:
        track = None
        if microphone is not None:
            self.player = MediaPlayer(str(microphone))
            track = self.player.audio
        self.call = await lc.open_call(
            self._lipstream(),
            self.avatar,
            pc=self.pc,
            microphone=track,
            receive_audio=self.audio or track is not None,
            data_channel=False,
            # What arrives is recorded as it comes; the bounds only stop a stuck test.
            queues=lc.QueueSizes(video=1500, audio=3000),
        )
        self.session_id = self.call.session_id
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "video" and not self.own_remb:
                receiver = transceiver.receiver
                receiver._RTCRtpReceiver__remote_bitrate_estimator = None  # type: ignore[attr-defined]
            codecs = negotiated_codecs(transceiver)
            if transceiver.kind == "video" and codecs:
                self.received.video_codec = codecs[0].mimeType
        self._tasks = [
            asyncio.create_task(self._record_video(self.call.video_frames())),
            asyncio.create_task(self._record_audio(self.call.audio_frames())),
        ]

    async def _record_video(self, frames: AsyncIterator[lc.VideoFrame]) -> None:
        r = self.received
        async for received in frames:
            frame = received.frame
            r.video_times.append(received.received_at)
            # Counted from the first frame, the session's frame 0 (the client does this).
            r.video_pts.append(round(received.media_ms * 90))
            r.size = (frame.width, frame.height)
            if self.keep_luma:
                r.luma[received.index] = frame.to_ndarray(format="yuv420p")[: frame.height]

    async def _record_audio(self, frames: AsyncIterator[lc.AudioFrame]) -> None:
        r = self.received
        async for received in frames:
            frame = received.frame
            pcm = frame.to_ndarray().astype(np.float32) / 32768.0
            r.audio_samples += frame.samples
            pts = round(received.media_ms * frame.sample_rate / 1000)
            r.audio_energy.append((pts, float(np.sqrt(np.mean(pcm**2)))))

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
        if self.call is not None:
            await self.call.hang_up()
        elif self.session_id:
            with contextlib.suppress(lc.SessionNotFound):
                await self._lipstream().hang_up(self.session_id)
        await self.close()

    async def close(self) -> None:
        if self.player is not None and self.player.audio is not None:
            self.player.audio.stop()
        if self.call is not None:
            await self.call.close()
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
