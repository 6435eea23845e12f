"""A LiveKit Agents voice agent with a lipstream avatar, and no cloud keys.

Its speech is espeak-ng's: no STT, LLM or TTS service is needed, so it runs with nothing
but a LiveKit server and a lipstream server (docs/guides/livekit.md). In every room it is
dispatched to, it starts lipstream's avatar with the three lines any agent uses, then
says one of its lines every few seconds through ``session.say(..., audio=...)``, as an
agent's TTS would.

    pip install 'lipstream-client[livekit]'       # and apt install espeak-ng
    LIVEKIT_URL=ws://127.0.0.1:7880 LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret \\
    LIPSTREAM_URL=http://127.0.0.1:8080 python livekit_avatar_agent.py dev

lipstream must be able to reach ``LIVEKIT_URL`` (for a LiveKit server on your own
network, ``livekit.allow_private: true`` in lipstream's settings).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import wave
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext, cli

from lipstream_client.livekit import AvatarSession

LINES = (
    "Hello, I am a lipstream avatar, speaking for a LiveKit agent.",
    "My voice comes from espeak, and my face from your own server.",
    "Interrupt me whenever you like; I will stop at once.",
)
PAUSE_S = 4.0
FRAME_S = 0.02


def espeak_pcm(text: str) -> tuple[np.ndarray, int]:
    """``text`` spoken by espeak-ng: 16-bit mono samples and their rate."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed: apt install espeak-ng")
    with tempfile.NamedTemporaryFile(suffix=".wav") as out:
        subprocess.run([exe, "-w", out.name, text], check=True, capture_output=True)
        with wave.open(out.name, "rb") as wav:
            rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return pcm, rate


async def speech_frames(text: str) -> AsyncIterator[rtc.AudioFrame]:
    """``text`` as the 20 ms frames an agent's TTS hands ``session.say``."""
    pcm, rate = await asyncio.to_thread(espeak_pcm, text)
    step = int(rate * FRAME_S)
    for start in range(0, len(pcm), step):
        chunk = pcm[start : start + step]
        yield rtc.AudioFrame(chunk.tobytes(), rate, 1, len(chunk))


server = AgentServer()


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    await ctx.connect()
    session: AgentSession[Any] = AgentSession()
    avatar = AvatarSession(os.environ.get("LIPSTREAM_URL", "http://127.0.0.1:8080"))
    await avatar.start(session, room=ctx.room)
    await session.start(agent=Agent(instructions="Say the lines."), room=ctx.room)
    turn = 0
    while ctx.room.isconnected():
        line = LINES[turn % len(LINES)]
        await session.say(line, audio=speech_frames(line)).wait_for_playout()
        turn += 1
        await asyncio.sleep(PAUSE_S)


if __name__ == "__main__":
    cli.run_app(server)
