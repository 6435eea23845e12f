"""A LiveKit room to measure lipstream's avatar in: a real ``livekit-server`` and a
subscriber that watches and hears the avatar (``benchmarks/livekit.py`` and the tests of
``tests/test_livekit.py``).

:func:`run_livekit` starts ``livekit-server`` (v1.13.5, which ``.ci/run`` builds with
``go install``) in dev mode (single node, no Redis) on loopback, on free ports
(signalling and API, RTC over TCP, one UDP port), with an API key of its own (a secret
long enough that PyJWT does not warn), and stops it after; the server auto-creates
rooms. Without the binary it raises :class:`LiveKitServerError` naming how to build it.

:class:`Subscriber` is a participant of the ``livekit`` SDK that subscribes to the
avatar's tracks and records, on the monotonic clock every process here shares, when each
decoded video frame and each 10 ms of audio arrived: the frame's size and the darkness
of its mouth box (the demo model draws an open, dark mouth;
``benchmarks/browser_delay.py``'s ``mouth_box``), and the audio's samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
from livekit import api, rtc

from benchmarks.browser_delay import rising_edges
from benchmarks.server_process import free_port

SERVER = Path(os.environ.get("LIPSTREAM_LIVEKIT_DIR", "/opt/lipstream-ci/livekit")) / "server"
BUILD = (
    "GOBIN={dir} go install github.com/livekit/livekit-server/cmd/server@v1.13.5 "
    "(.ci/run does), Go 1.26 or later"
)
API_KEY = "lipstreamtests"
API_SECRET = "lipstream-tests-secret-0123456789abcdef"
START_S = 20.0
AUDIO_RATE = 48_000
#: The luma under which a mouth-box pixel counts as dark (tests/test_demo_page.py's probe).
DARK_LUMA = 160
#: The participant attribute that marks an agent's avatar (livekit-agents').
PUBLISH_ON_BEHALF = "lk.publish_on_behalf"


class LiveKitServerError(RuntimeError):
    """livekit-server is missing, exited or does not answer (the message says which)."""


@dataclass
class LiveKit:
    """A running server: its URL for the SDKs, its HTTP base, and its process."""

    url: str  # ws://127.0.0.1:port
    http: str
    process: subprocess.Popen[bytes]
    log: Path

    def token(
        self,
        identity: str,
        room: str,
        *,
        kind: str | None = None,
        attributes: dict[str, str] | None = None,
        can_publish: bool = True,
        ttl_s: float = 600.0,
        secret: str = API_SECRET,
    ) -> str:
        """An access token for ``identity`` in ``room``, signed with the server's key."""
        grants = api.VideoGrants(room_join=True, room=room, can_publish=can_publish)
        token = (
            api.AccessToken(API_KEY, secret)
            .with_identity(identity)
            .with_grants(grants)
            .with_ttl(timedelta(seconds=ttl_s))
        )
        if kind is not None:
            token = token.with_kind(kind)  # type: ignore[arg-type]  # checked by the server
        if attributes:
            token = token.with_attributes(attributes)
        return token.to_jwt()

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): no goodbye to anyone in its rooms."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def server_binary() -> Path:
    """The livekit-server binary (module doc)."""
    if SERVER.is_file():
        return SERVER
    found = shutil.which("livekit-server")
    if found:
        return Path(found)
    raise LiveKitServerError(
        f"livekit-server is not at {SERVER}: build it with {BUILD.format(dir=SERVER.parent)}"
    )


@contextlib.contextmanager
def run_livekit(directory: Path) -> Iterator[LiveKit]:
    """A livekit-server (module doc), its log under ``directory``; stopped on exit."""
    binary = server_binary()
    port, tcp_port, udp_port = free_port(), free_port(), free_port()
    config = (
        f"port: {port}\n"
        f"rtc:\n  tcp_port: {tcp_port}\n  udp_port: {udp_port}\n"
        f"keys:\n  {API_KEY}: {API_SECRET}\n"
    )
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "livekit.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(binary), "--dev", "--bind", "127.0.0.1", "--node-ip", "127.0.0.1"],
            env={**os.environ, "LIVEKIT_CONFIG": config},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = LiveKit(f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_S
        while not _answers(server.http):
            if process.poll() is not None:
                raise LiveKitServerError(
                    f"livekit-server exited ({process.returncode}):\n{server.tail()}"
                )
            if time.monotonic() > deadline:
                raise LiveKitServerError(
                    f"livekit-server did not answer in {START_S:g} s:\n{server.tail()}"
                )
            time.sleep(0.1)  # polling the server's start-up
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as answer:
        return bool(answer.status == 200)
    return False


@dataclass
class Heard:
    """What the subscriber got of the avatar: per video frame ``(render_s, darkness)``
    (the time libwebrtc's jitter buffer set to show it, on the monotonic clock, as the
    frame's ``timestamp_us``), its arrival and its size; and the audio in 10 ms frames
    with the time each arrived."""

    frames: list[tuple[float, float]] = field(default_factory=list)
    arrived_s: list[float] = field(default_factory=list)
    sizes: set[tuple[int, int]] = field(default_factory=set)
    audio_times: list[float] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)

    def frames_between(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        return [f for f in self.frames if start_s <= f[0] < end_s]

    def audio_clock(self) -> np.ndarray:
        """When each audio frame was played out: the audio comes as libwebrtc's playout
        takes it, 10 ms at a time on its own clock, but reaches this event loop late by
        however busy it is; so a frame's time is its sample count from the first, plus
        the smallest lateness any frame showed."""
        arrived = np.asarray(self.audio_times, dtype=float)
        counts = np.asarray([len(a) for a in self.audio], dtype=float)
        played = np.concatenate(([0.0], np.cumsum(counts)[:-1])) / AUDIO_RATE
        return played + float(np.min(arrived - played))

    def audio_rms(self) -> np.ndarray:
        return np.asarray([np.sqrt(np.mean(a.astype(np.float64) ** 2)) for a in self.audio])


class Subscriber:
    """A participant subscribed to the avatar's tracks (module doc)."""

    def __init__(self, livekit: LiveKit, room_name: str, box: tuple[int, int, int, int]) -> None:
        self.livekit = livekit
        self.room_name = room_name
        self.box = box
        self.room = rtc.Room()
        self.heard = Heard()
        self._tasks: list[asyncio.Task[None]] = []
        self.room.on("track_subscribed", self._subscribed)

    async def connect(self) -> None:
        token = self.livekit.token("viewer", self.room_name)
        await self.room.connect(self.livekit.url, token, rtc.RoomOptions(auto_subscribe=True))

    def avatar(self) -> rtc.RemoteParticipant | None:
        for participant in self.room.remote_participants.values():
            if PUBLISH_ON_BEHALF in participant.attributes:
                return participant
        return None

    def _subscribed(
        self,
        track: rtc.Track,
        publication: rtc.RemoteTrackPublication,
        participant: rtc.RemoteParticipant,
    ) -> None:
        if PUBLISH_ON_BEHALF not in participant.attributes:
            return
        if track.kind == rtc.TrackKind.KIND_VIDEO:
            self._tasks.append(asyncio.create_task(self._watch(track)))
        elif track.kind == rtc.TrackKind.KIND_AUDIO:
            self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _watch(self, track: rtc.Track) -> None:
        x, y, w, h = self.box
        async with contextlib.aclosing(
            rtc.VideoStream(track, format=rtc.VideoBufferType.I420)
        ) as stream:
            async for event in stream:
                frame = event.frame
                luma = np.frombuffer(frame.data, dtype=np.uint8, count=frame.width * frame.height)
                mouth = luma.reshape(frame.height, frame.width)[y : y + h, x : x + w]
                dark = np.clip(DARK_LUMA - mouth.astype(np.int16), 0, None).mean()
                self.heard.frames.append((event.timestamp_us / 1e6, float(dark)))
                self.heard.arrived_s.append(time.monotonic())
                self.heard.sizes.add((frame.width, frame.height))

    async def _listen(self, track: rtc.Track) -> None:
        async with contextlib.aclosing(
            rtc.AudioStream(track, sample_rate=AUDIO_RATE, num_channels=1)
        ) as stream:
            async for event in stream:
                pcm = np.frombuffer(event.frame.data, dtype=np.int16).copy()
                if not len(pcm):
                    continue
                self.heard.audio_times.append(time.monotonic())
                self.heard.audio.append(pcm)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.room.disconnect()


def sound_onsets(heard: Heard, since_s: float, quiet_s: float = 0.5) -> list[float]:
    """Where the avatar's voice starts after ``quiet_s`` of quiet, at the subscriber."""
    times, rms = heard.audio_clock(), heard.audio_rms()
    keep = times >= since_s
    if not keep.any():
        return []
    return rising_edges(times[keep].tolist(), rms[keep].tolist(), 0.1 * rms[keep].max(), quiet_s)


def open_level(frames: list[tuple[float, float]]) -> float:
    """Darkness over which the mouth is open: a quarter of the way from shut (median) to
    wide (99th percentile), as ``benchmarks/browser_delay.py``'s ``mouth_onsets``."""
    dark = np.asarray([d for _, d in frames])
    shut, wide = float(np.median(dark)), float(np.percentile(dark, 99))
    return shut + 0.25 * (wide - shut)


def buzz_bursts(rate: int, bursts: int, burst_s: float = 0.2, gap_s: float = 0.6) -> np.ndarray:
    """``bursts`` buzz bursts at ``rate``, each after ``gap_s`` of silence, and 0.2 s of
    silence after: a 110 Hz sawtooth up to 7.6 kHz, as ``benchmarks/browser_delay.py``'s
    probe. A buzz fills the mel bands the demo model opens its mouth by, as a voice
    does, and starts at once, so its onset at a subscriber and the mouth's are each one
    clear edge (a word's onset is not: an "h" or an "s" is sound the model barely opens
    for)."""
    t = np.arange(int(burst_s * rate)) / rate
    buzz = np.sum([np.sin(2 * np.pi * 110 * k * t) / k for k in range(1, 70)], axis=0)
    buzz *= 0.15 * np.minimum(1.0, np.minimum(t, burst_s - t) / 0.005)  # 5 ms ramps
    gap = np.zeros(int(gap_s * rate))
    tail = np.zeros(int(0.2 * rate))
    return np.concatenate([part for _ in range(bursts) for part in (gap, buzz)] + [tail]).astype(
        np.float32
    )
