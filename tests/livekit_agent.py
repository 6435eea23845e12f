"""A LiveKit Agents worker, run as its own process by ``tests/test_livekit.py``.

It registers with the test's livekit-server (``LIVEKIT_URL``, ``LIVEKIT_API_KEY``,
``LIVEKIT_API_SECRET``) under :data:`AGENT_NAME`, for explicit dispatch, and its job does
what a production agent with a lipstream avatar does: ``AvatarSession(...).start`` with
the job's room, then ``AgentSession.start``. No STT, LLM or TTS: the test has the agent
speak WAV files (espeak-ng's) through ``session.say(text, audio=...)``, and interrupt,
by RPC from the test's own participant:

- ``test.say`` (payload: a WAV path): speaks it; answers at once with ``"ok"``;
- ``test.interrupt``: ``session.interrupt()``; answers with the monotonic time (s) it
  was called at (one clock for every process on the machine);
- ``test.playback``: waits until the last ``say`` has finished playing (or was cut),
  then answers with JSON: ``interrupted`` (the speech handle's), and each
  ``playback_finished`` the avatar's audio output reported (``playback_position``,
  ``interrupted``), and the avatar's metrics the session collected;
- ``test.leave``: leaves the room without a word to lipstream, as an agent that crashed
  does (its ``AvatarSession`` forgets its lipstream session first, so the job's shutdown
  does not hang it up);
- ``test.end``: ends the job as an agent does when its conversation is over: the job's
  shutdown closes the ``AvatarSession``, which hangs up its lipstream session.

Usage: ``python tests/livekit_agent.py LIPSTREAM_URL [AVATAR_IDENTITY]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import wave
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext, JobExecutorType
from livekit.agents.metrics.base import AvatarMetrics
from livekit.agents.voice import MetricsCollectedEvent

from lipstream_client.livekit import AvatarSession

AGENT_NAME = "lipstream-test-agent"
FRAME_S = 0.02


async def wav_frames(path: str) -> AsyncIterator[rtc.AudioFrame]:
    """``path``'s audio as 20 ms frames at its own rate, as fast as they are taken."""
    with wave.open(path, "rb") as wav:
        rate, channels = wav.getframerate(), wav.getnchannels()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    step = int(rate * FRAME_S) * channels
    for start in range(0, len(pcm), step):
        chunk = pcm[start : start + step]
        yield rtc.AudioFrame(chunk.tobytes(), rate, channels, len(chunk) // channels)


async def _after_answer(action: Coroutine[Any, Any, None]) -> None:
    await asyncio.sleep(0.2)  # the RPC's answer reaches the test before the agent leaves
    await action


def main() -> None:
    lipstream_url = sys.argv[1]
    identity = sys.argv[2] if len(sys.argv) > 2 else "lipstream-avatar"
    logging.basicConfig(level=logging.INFO)
    server = AgentServer(job_executor_type=JobExecutorType.THREAD, num_idle_processes=0, port=0)

    async def entrypoint(ctx: JobContext) -> None:
        await ctx.connect()
        session: AgentSession[Any] = AgentSession()
        avatar = AvatarSession(lipstream_url, avatar="demo", avatar_identity=identity)
        metrics: list[dict[str, Any]] = []
        finished: list[dict[str, Any]] = []

        def collected(event: MetricsCollectedEvent) -> None:
            if isinstance(event.metrics, AvatarMetrics):
                metrics.append(event.metrics.model_dump(mode="json"))

        session.on("metrics_collected", collected)
        await avatar.start(session, room=ctx.room)
        await session.start(agent=Agent(instructions="You are a test."), room=ctx.room)
        tail = avatar.audio_output
        assert tail is not None
        tail.on(
            "playback_finished",
            lambda ev: finished.append(
                {"playback_position": ev.playback_position, "interrupted": ev.interrupted}
            ),
        )
        speaking: list[Any] = []
        leaving: list[asyncio.Task[None]] = []

        async def say(data: rtc.RpcInvocationData) -> str:
            speaking.append(session.say("test speech", audio=wav_frames(data.payload)))
            return "ok"

        async def interrupt(data: rtc.RpcInvocationData) -> str:
            at = time.monotonic()
            await session.interrupt()
            return json.dumps(at)

        async def leave(data: rtc.RpcInvocationData) -> str:
            avatar.session = None
            # After the answer went: the disconnect is the test's subject, not the RPC.
            leaving.append(asyncio.create_task(_after_answer(ctx.room.disconnect())))
            return "ok"

        async def end(data: rtc.RpcInvocationData) -> str:
            asyncio.get_running_loop().call_soon(ctx.shutdown, "test.end")
            return "ok"

        async def playback(data: rtc.RpcInvocationData) -> str:
            handle = speaking[-1]
            await handle.wait_for_playout()
            await asyncio.sleep(0)  # let the output's playback_finished handlers run
            body = {"interrupted": handle.interrupted, "finished": finished, "metrics": metrics}
            return json.dumps(body)

        participant = ctx.room.local_participant
        participant.register_rpc_method("test.say", say)
        participant.register_rpc_method("test.interrupt", interrupt)
        participant.register_rpc_method("test.playback", playback)
        participant.register_rpc_method("test.leave", leave)
        participant.register_rpc_method("test.end", end)
        await participant.set_attributes({"test.ready": "1"})

    server.rtc_session(entrypoint, agent_name=AGENT_NAME)
    asyncio.run(server.run(devmode=True))


if __name__ == "__main__":
    main()
