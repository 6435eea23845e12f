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
from tests.media import write_wav
from tests.webrtc_client import Caller
from web.app import build_app
from web.app_keys import CORE, SESSIONS

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
IDLE_TIMEOUT_S = 1.5
# From the moment a caller disappears until its session is gone (the bound).
# The session's own watchdog (PEER_SILENCE_S) is meant to beat aioice's consent checks,
# which alone take 27-39 s.
VANISHED_FREED_WITHIN_S = 35.0


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


async def _until(condition: Callable[[], bool], timeout_s: float) -> float:
    """Poll ``condition`` until it holds; the seconds it took (TimeoutError after ``timeout_s``)."""
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - test polling
            await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_call_without_audio_ends_as_idle(client: TestClient[object, object]) -> None:
    manager = _manager(client)
    caller = Caller(client)
    await caller.connect(microphone=None)
    try:
        sid = caller.session_id
        assert [s.session_id for s in manager.sessions] == [sid]
        took = await _until(lambda: not manager.sessions, timeout_s=3.0)
        logger.info("silent call ended %.2f s after its answer", took)
        assert manager.counters.ended_by_reason == {"idle": 1}
        assert (await client.get(f"/sessions/{sid}")).status == 404
    finally:
        await caller.close()


async def test_call_with_speech_stays_until_the_speech_stops(
    client: TestClient[object, object], tmp_path: Path
) -> None:
    manager = _manager(client)
    t = np.arange(8_000) / 16_000  # 0.5 s of a loud tone: well above the VAD threshold
    body = write_wav(tmp_path / "tone.wav", 0.3 * np.sin(2 * np.pi * 220 * t)).read_bytes()
    caller = Caller(client)
    caller.keep_luma = False
    await caller.connect(microphone=None)
    try:
        sid = caller.session_id
        await caller.wait_for_frames(1)
        speaking_until = time.monotonic() + 3 * IDLE_TIMEOUT_S
        while time.monotonic() < speaking_until:
            pushed = await client.post(
                f"/sessions/{sid}/audio", data=body, headers={"Content-Type": "audio/wav"}
            )
            assert pushed.status == 202, await pushed.text()  # 404 once the session ended
            await asyncio.sleep(0.5)
        assert [s.session_id for s in manager.sessions] == [sid]
        assert manager.counters.ended == 0
        frames = len(caller.received.video_times)
        await asyncio.sleep(0.5)
        assert len(caller.received.video_times) > frames  # still streaming
        # Silence from here on: the call ends by itself.
        await _until(lambda: not manager.sessions, timeout_s=2 * IDLE_TIMEOUT_S + 1.0)
        assert manager.counters.ended_by_reason == {"idle": 1}
    finally:
        await caller.close()


@pytest.mark.slow
async def test_vanished_caller_is_freed_within_35_s(
    tmp_path: Path, loopback: None, record_property: Callable[[str, object], None]
) -> None:
    """A caller killed mid-call (no hang-up, no DTLS close) is dropped; a live one is not."""
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
        async with asyncio.timeout(30.0):
            line = (await proc.stdout.readline()).decode()
        assert line.startswith("streaming "), line
        sid = line.split()[1]
        session = manager.get(sid)
        # A caller that is still there outlives the silence deadline.
        await asyncio.sleep(PEER_SILENCE_S + 3 * PEER_CHECK_S)
        assert session.state == "streaming"
        assert manager.sessions == [session]
        proc.kill()
        await proc.wait()
        took = await _until(lambda: not manager.sessions, timeout_s=VANISHED_FREED_WITHIN_S)
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
