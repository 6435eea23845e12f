"""A stage that fails ends its call, named, while another call streams on.

One rule (``docs/design/threads.md`` §7): any task a session owns that ends other than by
cancellation ends the call, with a reason naming the stage (``<stage> failed``), counted
in the end-reason totals, told to the caller (``session_ended`` on its data channel) and
logged. Each test makes two real calls (aiortc callers through ``lipstream_client``) to
the real app, one per avatar, and injects a fault into the stage under test for the
``faulty`` avatar's call only:

* ``timeline``: a timeline job raises (what a broken feature extractor or Opus encoder
  would do);
* ``render``: the paste of a face into its frame raises (in a render task);
* ``encode``: making the frame the video track sends raises (the H.264 path);
* ``audio receive``: taking the caller's decoded microphone audio raises (it runs in
  aiortc's receive path, where an error would otherwise only be logged).

The faulty call must end with its named reason within a bounded number of frames of the
fault (at most :data:`FRAMES_AFTER_FAULT`, two seconds of video: counted in frames, not
timed, so the test holds on a loaded machine), while the other call keeps streaming.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc.contrib.media import MediaPlayer

import lipstream_client as lc
from config.settings import Settings
from inference_core.assets.demo_avatar import write_demo_avatar
from streaming.frame_pipeline import FramePipeline
from streaming.live.manager import SessionManager
from streaming.live.mixer import AudioMixer
from streaming.live.pipeline import LivePipeline
from streaming.live.session import Session
from streaming.live.timeline import AudioTimeline
from tests.live_calls import until
from tests.media import write_wav
from web.app import build_app
from web.app_keys import SESSIONS

Client = TestClient[web.Request, web.Application]
logger = logging.getLogger(__name__)

FAULTY = "faulty"
#: Video frames the faulty call may still send after its fault: two seconds' worth.
FRAMES_AFTER_FAULT = 50


@pytest.fixture
def avatar_root(tmp_path: Path) -> Path:
    root = tmp_path / "avatars"
    write_demo_avatar(root / FAULTY, count=30)
    return root


@pytest.fixture
async def client(avatar_root: Path, loopback: None) -> AsyncIterator[Client]:
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(avatar_root), "data_dir": str(avatar_root.parent / "data")},
            "devices": {"kind": "cpu", "count": 1},
            "video": {"preset": "ultrafast"},
            "server": {"offer_rate_limit_per_minute": 0},
        }
    )
    async with TestClient(TestServer(build_app(settings), host="127.0.0.1")) as test_client:
        yield test_client


@pytest.fixture
def speech_wav(speech_16k: tuple[np.ndarray, list[tuple[float, float]]], tmp_path: Path) -> Path:
    pcm, _ = speech_16k
    looped = np.tile(pcm, 6)  # ~30 s: the microphone outlasts every test
    return write_wav(tmp_path / "speech.wav", looped, 16_000)


@dataclass
class Fault:
    """A fault patched into a stage before the calls start, fired for one call only:
    :attr:`session` arms it; it records the frames that call had sent when it first fired."""

    session: Session | None = None
    fired_at_frame: int | None = None
    fired_time = 0.0  # time.monotonic() when it first fired

    def fire(self) -> None:
        assert self.session is not None
        if self.fired_at_frame is None:
            self.fired_at_frame = self.session.frames_sent
            self.fired_time = time.monotonic()
        raise RuntimeError("injected fault")


def _manager(client: Client) -> SessionManager:
    return client.server.app[SESSIONS]


async def _call(client: Client, avatar: str, microphone: Path | None = None) -> lc.Call:
    track = MediaPlayer(str(microphone)).audio if microphone is not None else None
    return await lc.connect(
        str(client.make_url("")),
        avatar,
        microphone=track,
        session=client.session,
        queues=lc.QueueSizes(video=200, audio=400, events=200),
    )


async def _ended_event(call: lc.Call) -> dict[str, Any]:
    async for event in call.events():
        if event["type"] == "session_ended":
            return dict(event)
    raise AssertionError("the data channel closed without session_ended")


async def _run_with_fault(
    client: Client,
    caplog: pytest.LogCaptureFixture,
    stage: str,
    fault: Fault,
    *,
    speak: bool = False,
    microphone: Path | None = None,
) -> None:
    """Two calls; ``fault`` armed for the faulty one; the rule checked (module doc)."""
    manager = _manager(client)
    healthy = await _call(client, "demo")
    faulty = await _call(client, FAULTY, microphone)
    try:
        session = manager.get(faulty.session_id)
        ended = asyncio.create_task(_ended_event(faulty))
        with caplog.at_level(logging.INFO, logger="streaming.live"):
            fault.session = session
            if speak:  # only spoken frames are rendered
                await faulty.say("the avatar speaks now, for a while, so that frames render")
            async with asyncio.timeout(60):
                event = await ended
            event_at = time.monotonic()
            await until(lambda: manager.counters.ended == 1, "the call to be torn down")
        reason = f"{stage} failed"
        assert event["reason"] == reason
        assert session.end_reason == reason
        assert manager.counters.ended_by_reason == {reason: 1}
        metrics = await (await client.get("/metrics")).text()
        assert f'lipstream_sessions_ended_total{{reason="{reason}"}} 1.0' in metrics
        messages = [(r.getMessage(), r.exc_info) for r in caplog.records]
        assert any(f"reason={reason} " in m and "session ended" in m for m, _ in messages)
        assert any(f"session stage {stage} failed" in m and info for m, info in messages), (
            "the stage's error is logged with its traceback"
        )
        assert fault.fired_at_frame is not None
        after = session.frames_sent - fault.fired_at_frame
        logger.info(
            "%s: %d frames sent after the fault, session_ended %.3f s after it",
            stage,
            after,
            event_at - fault.fired_time,
        )
        assert after <= FRAMES_AFTER_FAULT
        with pytest.raises(lc.SessionNotFound):
            await healthy.client.state(faulty.session_id)

        # The other call streams on.
        other = manager.get(healthy.session_id)
        before = other.frames_sent
        await until(lambda: other.frames_sent >= before + 25, "the other call to go on")
        assert other.state == "streaming"
        assert (await healthy.state())["state"] == "streaming"
    finally:
        await faulty.hang_up()
        await healthy.hang_up()


async def test_a_failed_timeline_ends_its_call_only(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    original = AudioTimeline._process_chunks

    def process(timeline: AudioTimeline[Any], *args: Any) -> Any:
        if fault.session is not None and timeline is fault.session.pipeline.timeline:
            fault.fire()
        return original(timeline, *args)

    monkeypatch.setattr(AudioTimeline, "_process_chunks", process)
    await _run_with_fault(client, caplog, "timeline", fault)


async def test_a_failed_render_ends_its_call_only(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    original = FramePipeline.compose

    def compose(pipeline: FramePipeline, *args: Any) -> Any:
        if fault.session is not None and pipeline.package.avatar_id == FAULTY:
            fault.fire()
        return original(pipeline, *args)

    monkeypatch.setattr(FramePipeline, "compose", compose)
    await _run_with_fault(client, caplog, "render", fault, speak=True)


async def test_a_failed_encode_ends_its_call_only(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = Fault()
    original = LivePipeline.packet_for

    async def packet_for(pipeline: LivePipeline, *args: Any) -> Any:
        if fault.session is not None and pipeline is fault.session.pipeline:
            fault.fire()
        return await original(pipeline, *args)

    monkeypatch.setattr(LivePipeline, "packet_for", packet_for)
    await _run_with_fault(client, caplog, "encode", fault)


async def test_a_failed_audio_receive_ends_its_call_only(
    client: Client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    speech_wav: Path,
) -> None:
    fault = Fault()
    original = AudioMixer.feed_inbound

    def feed_inbound(mixer: AudioMixer, samples: np.ndarray) -> None:
        if fault.session is not None and mixer is fault.session.pipeline.mixer:
            fault.fire()
        original(mixer, samples)

    monkeypatch.setattr(AudioMixer, "feed_inbound", feed_inbound)
    await _run_with_fault(client, caplog, "audio receive", fault, microphone=speech_wav)
