"""What ``tests/test_livekit.py`` puts in a LiveKit room besides lipstream: the agent
worker, and a subscriber that watches and hears the avatar.

:class:`AgentWorker` runs ``tests/livekit_agent.py`` as its own process, registered with
the test's livekit-server as a production worker is, and dispatches it to rooms
(livekit-api's ``AgentDispatchService``). :class:`Subscriber` is a participant of the
``livekit`` SDK that subscribes to the avatar's tracks and records, on the monotonic
clock every process here shares, when each decoded video frame and each 10 ms of audio
arrived: the frame's size and the darkness of its mouth box (the demo model draws an
open, dark mouth; ``benchmarks/browser_delay.py``'s ``mouth_box``), and the audio's
samples. It talks to the agent by RPC (``test.*``, tests/livekit_agent.py). :class:`Agent` is
an agent this process plays, for tests that need no worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from livekit import api, rtc
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.agents.voice.io import PlaybackFinishedEvent

from tests.live_calls import TIMEOUT_S, until
from tests.livekit_server import API_KEY, API_SECRET, LiveKit

AGENT_PROGRAM = Path(__file__).with_name("livekit_agent.py")
AGENT_NAME = "lipstream-test-agent"
AUDIO_RATE = 48_000
#: The luma under which a mouth-box pixel counts as dark (tests/test_demo_page.py's probe).
DARK_LUMA = 160
#: Seconds the worker has to import livekit-agents and register (cold imports are slow).
REGISTER_S = 90.0


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
            if "lk.publish_on_behalf" in participant.attributes:
                return participant
        return None

    def agent(self) -> rtc.RemoteParticipant | None:
        """The agent worker's participant, once it is in the room and ready."""
        for participant in self.room.remote_participants.values():
            if participant.attributes.get("test.ready") == "1":
                return participant
        return None

    def _subscribed(
        self,
        track: rtc.Track,
        publication: rtc.RemoteTrackPublication,
        participant: rtc.RemoteParticipant,
    ) -> None:
        if "lk.publish_on_behalf" not in participant.attributes:
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

    async def ask(self, method: str, payload: str = "") -> str:
        """An RPC to the agent (tests/livekit_agent.py's ``test.*``)."""
        agent = self.agent()
        assert agent is not None, "the agent is not in the room"
        return await self.room.local_participant.perform_rpc(
            destination_identity=agent.identity,
            method=method,
            payload=payload,
            response_timeout=TIMEOUT_S,
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.room.disconnect()


@dataclass
class AgentWorker:
    """The worker process (module doc) and the LiveKit API it is dispatched with."""

    livekit: LiveKit
    process: asyncio.subprocess.Process
    log: Path

    async def dispatch(self, room_name: str) -> None:
        async with api.LiveKitAPI(self.livekit.http, API_KEY, API_SECRET) as lkapi:
            await lkapi.agent_dispatch.create_dispatch(
                api.CreateAgentDispatchRequest(agent_name=AGENT_NAME, room=room_name)
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@contextlib.asynccontextmanager
async def agent_worker(
    livekit: LiveKit, lipstream_url: str, directory: Path, *args: str
) -> AsyncIterator[AgentWorker]:
    """tests/livekit_agent.py running, registered with ``livekit``; stopped after."""
    log = directory / "agent.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LIPSTREAM_")},
        "LIVEKIT_URL": livekit.url,
        "LIVEKIT_API_KEY": API_KEY,
        "LIVEKIT_API_SECRET": API_SECRET,
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(AGENT_PROGRAM),
            lipstream_url,
            *args,
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    worker = AgentWorker(livekit, process, log)
    try:

        def registered() -> bool:
            if process.returncode is not None:
                pytest.fail(f"the agent worker exited ({process.returncode}):\n{worker.tail()}")
            return "registered worker" in log.read_text(errors="replace")

        await until(registered, "the agent worker registered", timeout_s=REGISTER_S, poll_s=0.2)
        yield worker
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(15):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


class Agent:
    """A participant of kind agent in ``room``, played by this process: it speaks to the
    avatar as livekit-agents does, with livekit-agents' own ``DataStreamAudioOutput``."""

    def __init__(self, livekit: LiveKit, room: str) -> None:
        self.livekit = livekit
        self.name = room
        self.identity = f"agent-{room}"
        self.room = rtc.Room()
        self.output: DataStreamAudioOutput | None = None
        self.finished: list[PlaybackFinishedEvent] = []

    async def connect(self) -> None:
        token = self.livekit.token(self.identity, self.name, kind="agent")
        await self.room.connect(self.livekit.url, token)

    def avatar_token(self, **overrides: Any) -> str:
        """The token an avatar plugin mints for this agent's avatar."""
        fields: dict[str, Any] = {
            "kind": "agent",
            "attributes": {"lk.publish_on_behalf": self.identity},
        }
        fields.update(overrides)
        return self.livekit.token(f"avatar-{self.name}", self.name, **fields)

    async def speak(self, pcm: np.ndarray, rate: int) -> None:
        """One segment, as fast as it is taken (a TTS is faster than real time)."""
        if self.output is None:
            self.output = DataStreamAudioOutput(
                self.room, destination_identity=f"avatar-{self.name}", sample_rate=rate
            )
            self.output.on("playback_finished", self.finished.append)
        samples = (np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        step = rate // 50
        for start in range(0, len(samples), step):
            chunk = samples[start : start + step]
            await self.output.capture_frame(rtc.AudioFrame(chunk.tobytes(), rate, 1, len(chunk)))
        self.output.flush()

    async def close(self) -> None:
        await self.room.disconnect()


def playback(answer: str) -> dict[str, Any]:
    """tests/livekit_agent.py's ``test.playback`` answer."""
    body: dict[str, Any] = json.loads(answer)
    return body
