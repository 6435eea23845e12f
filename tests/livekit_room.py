"""What ``tests/test_livekit.py`` puts in a LiveKit room besides lipstream: the agent
worker, and a subscriber that watches and hears the avatar.

:class:`AgentWorker` runs ``tests/livekit_agent.py`` as its own process, registered with
the test's livekit-server as a production worker is, and dispatches it to rooms
(livekit-api's ``AgentDispatchService``). :class:`Subscriber` is the benchmarks' viewer
(``benchmarks/livekit_room.py``: each decoded frame's mouth darkness and each 10 ms of
audio, on the monotonic clock), which also talks to the agent by RPC (``test.*``,
tests/livekit_agent.py). :class:`Agent` is
an agent this process plays, for tests that need no worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from livekit import api, rtc
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.agents.voice.io import PlaybackFinishedEvent

from benchmarks import livekit_room
from tests.live_calls import TIMEOUT_S, until
from tests.livekit_server import API_KEY, API_SECRET, LiveKit

AGENT_PROGRAM = Path(__file__).with_name("livekit_agent.py")
AGENT_NAME = "lipstream-test-agent"
#: Seconds the worker has to import livekit-agents and register (cold imports are slow).
REGISTER_S = 90.0


class Subscriber(livekit_room.Subscriber):
    """The room's viewer (``benchmarks/livekit_room.py``), which also talks to the agent
    worker by RPC."""

    def agent(self) -> rtc.RemoteParticipant | None:
        """The agent worker's participant, once it is in the room and ready."""
        for participant in self.room.remote_participants.values():
            if participant.attributes.get("test.ready") == "1":
                return participant
        return None

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
