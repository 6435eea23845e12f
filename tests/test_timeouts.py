"""Sessions that end by themselves: a caller that vanishes, a call with nothing to say."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from config.settings import Settings
from streaming.live.manager import SessionManager
from streaming.live.session import PEER_CHECK_S, PEER_SILENCE_S
from tests.live_calls import TIMEOUT_S, until
from tests.media import write_wav
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import CORE, SESSIONS

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
IDLE_TIMEOUT_S = 1.5


def _settings(tmp_path: Path, idle_timeout_s: float) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(tmp_path / "avatars"), "data_dir": str(tmp_path / "data")},
            "video": {"preset": "ultrafast"},
            "session": {"idle_timeout_s": idle_timeout_s},
        }
    )


@pytest.fixture
async def client(tmp_path: Path, loopback: None) -> AsyncIterator[TestClient[object, object]]:
    app = build_app(_settings(tmp_path, IDLE_TIMEOUT_S))
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


def _manager(client: TestClient[object, object]) -> SessionManager:
    manager: SessionManager = client.app[SESSIONS]  # type: ignore[index]
    return manager


async def _until(condition: Callable[[], bool], what: str) -> float:
    """Wait (generously, see tests/live_calls.py) until ``condition`` holds; the seconds it took."""
    started = time.monotonic()
    await until(condition, what, poll_s=0.1)
    return time.monotonic() - started


async def test_call_without_audio_ends_as_idle(client: TestClient[object, object]) -> None:
    manager = _manager(client)
    caller = Caller(client)
    await caller.connect(microphone=None)
    try:
        sid = caller.session_id
        assert [s.session_id for s in manager.sessions] == [sid]
        took = await _until(lambda: not manager.sessions, "the silent call to end")
        logger.info("silent call ended %.2f s after its answer", took)
        assert manager.counters.ended_by_reason == {"idle": 1}
        assert (await client.get(f"/sessions/{sid}")).status == 404
    finally:
        await caller.close()


async def test_call_with_speech_stays_until_the_speech_stops(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    manager = _manager(client)
    # One push of a loud tone, three idle timeouts long: the push itself counts as audio
    # only once, so what keeps the call up is the avatar hearing the tone as it plays.
    t = np.arange(round(3 * IDLE_TIMEOUT_S * 16_000)) / 16_000
    body = write_wav(tmp_path / "tone.wav", 0.3 * np.sin(2 * np.pi * 220 * t)).read_bytes()
    caller = Caller(client)
    caller.keep_luma = False
    await caller.connect(microphone=None)
    try:
        sid = caller.session_id
        await caller.wait_for_frames(1)
        pushed = await client.post(
            f"/sessions/{sid}/audio", data=body, headers={"Content-Type": "audio/wav"}
        )
        assert pushed.status == 202, await pushed.text()

        async def tone_played() -> bool:
            state = await client.get(f"/sessions/{sid}")
            assert state.status == 200, "the call ended while the tone played"
            return bool((await state.json())["queued_audio_s"] == 0)

        # Played in real time: the queue empties 3 idle timeouts after the push at the
        # earliest, and the call is still up then.
        await until(tone_played, "the tone to be played")
        assert [s.session_id for s in manager.sessions] == [sid]
        assert manager.counters.ended == 0
        await caller.wait_for_frames(len(caller.received.video_times) + 5)  # still streaming
        # Silence from here on: the call ends by itself.
        await _until(lambda: not manager.sessions, "the call to end after the tone")
        assert manager.counters.ended_by_reason == {"idle": 1}
    finally:
        await caller.close()


@pytest.mark.slow
async def test_vanished_caller_is_freed_by_the_peer_silence_watchdog(
    tmp_path: Path, loopback: None, record_property: Callable[[str, object], None]
) -> None:
    """A caller killed mid-call (no hang-up, no DTLS close) is dropped; a live one is not.

    The session's own watchdog ends it ("peer silent", after PEER_SILENCE_S): aioice's
    consent checks alone take 27-39 s and would end it as "connection failed".
    """
    app = build_app(_settings(tmp_path, idle_timeout_s=0))  # 0: idleness never ends it
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        await _call_from_a_process_and_kill_it(client, record_property)


async def _call_from_a_process_and_kill_it(
    client: TestClient[object, object], record_property: Callable[[str, object], None]
) -> None:
    manager = _manager(client)
    base_url = str(client.make_url("/")).rstrip("/")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.vanishing_caller",
        base_url,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(2 * TIMEOUT_S):  # a fresh interpreter, then a call
            line = (await proc.stdout.readline()).decode()
        assert line.startswith("streaming "), line
        sid = line.split()[1]
        session = manager.get(sid)
        # A caller that is still there outlives the silence deadline: the session goes on
        # sending past it (frames are sent at their slots on the wall clock, so this many
        # more cannot be sent sooner; a busy machine that skips slots only waits longer).
        outlive = session.frames_sent + round((PEER_SILENCE_S + 3 * PEER_CHECK_S) * 25)
        await _until(lambda: session.frames_sent >= outlive or session.closed, "frames sent")
        assert session.state == "streaming", session.end_reason
        assert manager.sessions == [session]
        proc.kill()
        await proc.wait()
        took = await _until(lambda: not manager.sessions, "the vanished caller's session to end")
        record_property("vanished_caller_freed_after_s", round(took, 1))
        logger.info("vanished caller's session freed %.1f s after the kill", took)
        assert session.end_reason == "peer silent"
        entry = client.app[CORE].registry.entry("demo")  # type: ignore[index]
        assert entry.model is not None
        assert entry.model.refcount == 0  # the session let go of its model
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
