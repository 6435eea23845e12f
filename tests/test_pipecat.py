"""The Pipecat service (``lipstream_client.pipecat``) in a real Pipecat pipeline.

No network services: a local processor plays the text-to-speech engine (espeak-ng
speech at 24 kHz, in 20 and 40 ms ``TTSAudioRawFrame`` chunks between
``TTSStartedFrame`` and ``TTSStoppedFrame``), :class:`LipstreamVideoService` sends it
to the demo avatar of a real ``lipstream serve``, and a sink collects what the service
pushes on: RGB video frames, the avatar's voice, and the frames it passes through.

What is asserted is counted in frames on the session's media timeline, never in
wall-clock rates (tests/live_calls.py): video frames per second of received voice, the
demo avatar's mouth (the luma of its mouth box against its own closed mouth, as
tests/test_streaming.py's ``MouthProbe``) open while the avatar speaks and still in the
silence after, and still from 5 frames (200 ms) after a Pipecat interruption; what each
utterance played (``LipstreamSpeechEndedFrame``); and a switch to a smaller avatar
mid-call, seen in the frames' size from the frame the server named.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import lipstream_client as lc
from compositor.yuv import bgr_to_i420
from inference_core.assets.demo_avatar import ensure_demo_avatar, write_demo_avatar
from inference_core.avatars.package import AvatarPackage
from tests.live_calls import TIMEOUT_S, until
from tests.media import espeak_wav, read_wav, resample_linear
from tests.server_process import lipstream_serve
from tests.test_streaming import MouthProbe

INSTALL = "pip install -e 'clients/python[pipecat]' (scripts/test.sh does)"
try:
    with warnings.catch_warnings():
        # Pipecat imports audioop, deprecated since Python 3.11.
        warnings.simplefilter("ignore", DeprecationWarning)
        from pipecat.frames.frames import (
            EndFrame,
            ErrorFrame,
            Frame,
            InterruptionFrame,
            OutputImageRawFrame,
            SpeechOutputAudioRawFrame,
            StartFrame,
            TTSAudioRawFrame,
            TTSStartedFrame,
            TTSStoppedFrame,
        )
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
        from pipecat.workers.runner import WorkerRunner

        from lipstream_client.pipecat import LipstreamSpeechEndedFrame, LipstreamVideoService
    PIPECAT_MISSING = ""
except ImportError as exc:  # a broken test environment: the test fails, it is not skipped
    PIPECAT_MISSING = f"{exc}: {INSTALL}"

logger = logging.getLogger(__name__)

RATE = 24_000
FPS = 25
#: The demo avatar's mouth: open while speaking above this, at rest below REST.
OPEN, REST = 8.0, 4.0
#: Audio chunks as a streaming TTS makes them: 20 and 40 ms, in turn.
CHUNK_SAMPLES = (RATE // 50, RATE // 25)


def spoken(tmp_path: Path, name: str, text: str) -> np.ndarray:
    """``text`` from espeak-ng as 24 kHz int16, trimmed to where it is loud."""
    pcm, rate = read_wav(espeak_wav(tmp_path / f"{name}.wav", text))
    pcm = resample_linear(pcm, rate, RATE)
    loud = np.flatnonzero(np.abs(pcm) > 0.01)
    return (pcm[loud[0] : loud[-1] + 1] * 32767).astype(np.int16)


if not PIPECAT_MISSING:

    class FakeTts(FrameProcessor):
        """Says int16 speech as a streaming TTS service does; passes every frame on."""

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            await self.push_frame(frame, direction)

        async def say(self, pcm: np.ndarray) -> None:
            await self.push_frame(TTSStartedFrame())
            start, turn = 0, 0
            while start < len(pcm):
                size = CHUNK_SAMPLES[turn % 2]
                chunk = pcm[start : start + size].tobytes()
                await self.push_frame(
                    TTSAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
                )
                start, turn = start + size, turn + 1
            await self.push_frame(TTSStoppedFrame())

    @dataclass
    class Seen:
        """A received video frame: its session index, arrival and mouth difference."""

        index: int
        received_at: float
        mouth: float
        size: tuple[int, int] = (0, 0)

    @dataclass
    class Collected:
        video: list[Seen] = field(default_factory=list)
        sizes: set[tuple[tuple[int, int], str | None, int]] = field(default_factory=set)
        voice_samples: int = 0
        voice_rates: set[int] = field(default_factory=set)
        loud_ms: list[float] = field(default_factory=list)
        played: list[LipstreamSpeechEndedFrame] = field(default_factory=list)
        passed: list[str] = field(default_factory=list)

    class Sink(FrameProcessor):
        """Collects what reaches the end of the pipeline, keeping numbers, not images."""

        def __init__(self, probe: MouthProbe | None) -> None:
            super().__init__()
            self.probe = probe
            self.got = Collected()

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            got = self.got
            if isinstance(frame, OutputImageRawFrame):
                width, height = frame.size
                got.sizes.add((frame.size, frame.format, len(frame.image)))
                index = int(frame.metadata["lipstream_index"])
                mouth = 0.0
                if self.probe is not None:
                    rgb = np.frombuffer(frame.image, np.uint8).reshape(height, width, 3)
                    luma = bgr_to_i420(np.ascontiguousarray(rgb[:, :, ::-1]))[:height]
                    mouth = self.probe.diff(index, luma)
                seen = Seen(
                    index, float(frame.metadata["lipstream_received_at"]), mouth, frame.size
                )
                got.video.append(seen)
            elif isinstance(frame, LipstreamSpeechEndedFrame):
                got.played.append(frame)
            elif isinstance(frame, SpeechOutputAudioRawFrame):
                got.voice_rates.add(frame.sample_rate)
                got.voice_samples += frame.num_frames
                samples = np.frombuffer(frame.audio, "<i2").astype(np.float32) / 32768
                if len(samples) and float(np.sqrt(np.mean(samples**2))) > 0.02:
                    got.loud_ms.append(float(frame.metadata["lipstream_media_ms"]))
            elif not isinstance(frame, StartFrame):
                got.passed.append(type(frame).__name__)
            await self.push_frame(frame, direction)


def mouths(video: list[Seen], first: float, last: float) -> list[float]:
    """The mouth differences of the frames with ``first <= index < last``."""
    return [s.mouth for s in video if first <= s.index < last]


@pytest.mark.slow
async def test_a_pipecat_pipeline_lip_syncs_tts_and_honours_interruptions(
    tmp_path: Path, loopback: None
) -> None:
    if PIPECAT_MISSING:
        pytest.fail(PIPECAT_MISSING)
    hello = spoken(tmp_path, "hello", "hello there, how are you doing today")
    long = spoken(
        tmp_path, "long", "this is a long sentence that keeps on going and going for a good while"
    )
    assert len(long) / RATE > 3.0
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        probe = MouthProbe(AvatarPackage.load(ensure_demo_avatar(tmp_path / "data")))
        tts, avatar, sink = (
            FakeTts(),
            LipstreamVideoService(base_url=url, avatar="demo"),
            Sink(probe),
        )
        events: list[lc.Event] = []

        @avatar.event_handler("on_speech_started")
        @avatar.event_handler("on_speech_ended")
        @avatar.event_handler("on_interrupted")
        async def on_event(service: LipstreamVideoService, event: lc.Event) -> None:
            events.append(event)

        def event(kind: str, utterance: int) -> lc.Event | None:
            for e in events:
                if e["type"] == kind and utterance in e.get("utterances", [e.get("utterance")]):
                    return e
            return None

        worker = PipelineWorker(
            Pipeline([tts, avatar, sink]),
            params=PipelineParams(audio_out_sample_rate=RATE),
            enable_rtvi=False,
            idle_timeout_secs=None,
            cancel_on_idle_timeout=False,
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run(), name="pipecat-runner")
        got = sink.got
        try:
            await until(lambda: len(got.video) >= FPS, "the avatar's first second")
            assert avatar.call is not None
            session_id = avatar.call.session_id

            # An utterance, then silence.
            await tts.say(hello)
            ended = await until(lambda: event("speech_ended", 1), "the first utterance to end")
            started = event("speech_started", 1)
            assert started is not None
            first, last = started["media_ms"] / 40, ended["media_ms"] / 40
            assert last - first == pytest.approx(len(hello) / RATE * FPS, abs=2)
            quiet_until = last + 2.5 * FPS
            await until(lambda: got.video[-1].index >= quiet_until, "2.5 s of silence after it")
            slack = 0.3 * FPS
            speaking = mouths(got.video, first + slack, last - slack)
            before = mouths(got.video, 0.5 * FPS, first - slack)
            after = mouths(got.video, last + 1.0 * FPS, quiet_until)
            assert speaking
            assert before
            assert after
            assert np.mean(np.array(speaking) > OPEN) > 0.5, f"mouth still in speech: {speaking}"
            assert max(before + after) < REST, f"mouth moved in silence: {before + after}"
            # The voice is the avatar's, lip-synced: loud where the utterance is.
            loud_frames = [ms / 40 for ms in got.loud_ms]
            assert loud_frames
            assert first - 2 <= min(loud_frames)
            assert max(loud_frames) <= last + 2

            # A long utterance, interrupted in the middle.
            await tts.say(long)
            started = await until(lambda: event("speech_started", 2), "the second utterance")
            into = started["media_ms"] / 40 + FPS
            await until(lambda: got.video[-1].index >= into, "a second of the long utterance")
            interrupted_at = time.monotonic()
            await worker.queue_frame(InterruptionFrame())
            cut = max(s.index for s in got.video if s.received_at <= interrupted_at)
            interrupted = await until(lambda: event("interrupted", 2), "the interrupted event")
            assert interrupted["dropped_ms"] > 500
            # What the user was sent of the cut utterance: at least the second seen.
            cut_end = event("speech_ended", 2)
            assert cut_end is not None, events
            assert cut_end["interrupted"] is True
            assert 900 <= cut_end["played_ms"] <= len(long) / RATE * 1000 - 500
            assert events.index(cut_end) < events.index(interrupted)
            assert interrupted["played"] == [{"utterance": 2, "played_ms": cut_end["played_ms"]}]
            await until(lambda: got.video[-1].index >= cut + 5 + 2 * FPS, "2 s after the cut")
            assert max(mouths(got.video, cut - FPS, cut + 1)) > OPEN, "not speaking when cut"
            tail = mouths(got.video, cut + 5, cut + 5 + 2 * FPS)
            assert len(tail) >= 1.5 * FPS
            assert max(tail) < REST, f"mouth moved after the interruption: {tail}"

            # An EndFrame right after an utterance: the avatar says it, then hangs up.
            stats = avatar.stats
            await tts.say(hello)
            await worker.queue_frame(EndFrame())
            async with asyncio.timeout(TIMEOUT_S):
                await running
        finally:
            if not running.done():
                await worker.cancel()
                await running

        # Counted on the media timeline: 25 frames a second of index span, and of voice.
        indices = [s.index for s in got.video]
        span = indices[-1] - indices[0] + 1
        voice_s = got.voice_samples / RATE
        assert indices == sorted(indices)
        assert len(indices) / span > 0.9, (len(indices), span, stats)
        assert len(indices) / (voice_s * FPS) == pytest.approx(1.0, abs=0.1), (
            len(indices),
            voice_s,
        )
        assert got.sizes == {((1280, 720), "RGB", 1280 * 720 * 3)}
        assert got.voice_rates == {RATE}
        # The TTS audio stopped at the service; the rest went on, interruption included.
        assert "TTSAudioRawFrame" not in got.passed
        assert {"TTSStartedFrame", "TTSStoppedFrame", "InterruptionFrame"} <= set(got.passed)
        assert got.passed[-1] == "EndFrame"
        # The service hung up once the last utterance was said.
        last_said = event("speech_ended", 3)
        assert last_said is not None, events
        assert last_said["duration_ms"] == pytest.approx(len(hello) / RATE * 1000, abs=60)
        # Each utterance's end went downstream as a frame: what it played, whether cut.
        played = [(f.utterance, f.interrupted) for f in got.played]
        assert played == [(1, False), (2, True), (3, False)], got.played
        assert got.played[0].played_ms == pytest.approx(got.played[0].duration_ms or 0, abs=20)
        assert got.played[1].played_ms == cut_end["played_ms"]
        assert got.played[2].played_ms == pytest.approx(last_said["duration_ms"], abs=20)
        assert max(got.loud_ms) >= last_said["media_ms"] - 500
        assert avatar.call is None
        async with lc.Client(url) as client:
            with pytest.raises(lc.SessionNotFound):
                await client.state(session_id)
        logger.info(
            "%d frames over a span of %d (%.3f), %.2f s of voice (%.3f frames per 40 ms), "
            "cut at frame %d (mouths from there: %s), at most %.2f from frame %d, %s",
            len(indices),
            span,
            len(indices) / span,
            voice_s,
            len(indices) / (voice_s * FPS),
            cut,
            [round(m, 1) for m in mouths(got.video, cut, cut + 8)],
            max(tail),
            cut + 5,
            stats,
        )


@pytest.mark.slow
async def test_an_unknown_avatar_and_a_rate_lipstream_does_not_take_are_reported(
    tmp_path: Path, loopback: None
) -> None:
    if PIPECAT_MISSING:
        pytest.fail(PIPECAT_MISSING)
    with pytest.raises(ValueError, match="sample_rate"):
        LipstreamVideoService(base_url="http://127.0.0.1:1", avatar="demo", sample_rate=8000)
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        nobody = LipstreamVideoService(base_url=url, avatar="nobody")
        demo = LipstreamVideoService(base_url=url, avatar="demo")
        tts = FakeTts()
        errors: list[ErrorFrame] = []
        worker = PipelineWorker(
            Pipeline([tts, demo, nobody]),
            params=PipelineParams(audio_out_sample_rate=RATE),
            enable_rtvi=False,
            idle_timeout_secs=None,
            cancel_on_idle_timeout=False,
        )

        @worker.event_handler("on_pipeline_error")
        async def on_error(worker: PipelineWorker, frame: ErrorFrame) -> None:
            errors.append(frame)

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run(), name="pipecat-runner")
        try:
            await until(lambda: errors, "the unknown avatar to be reported")
            assert errors[0].processor is nobody
            assert "nobody" in errors[0].error, errors[0].error
            assert nobody.call is None
            call = await until(lambda: demo.call, "the demo avatar's call")
            # 8 kHz is not a stream rate: refused once, clearly, and nothing is sent.
            telephone = np.zeros(8000, np.int16).tobytes()
            for _ in range(3):
                await tts.push_frame(TTSAudioRawFrame(telephone, sample_rate=8000, num_channels=1))
            await until(lambda: len(errors) >= 2, "the 8 kHz audio to be refused")
            assert errors[1].processor is demo
            assert "not 8000 Hz" in errors[1].error, errors[1].error
            logger.info("reported: %s", [e.error for e in errors])
            # A CancelFrame hangs up at once.
            await worker.cancel()
            async with asyncio.timeout(TIMEOUT_S):
                await running
        finally:
            if not running.done():
                await worker.cancel()
                await running
        assert len(errors) == 2, [e.error for e in errors]
        assert demo.call is None
        assert call.connection_state == "closed"
        async with lc.Client(url) as client:
            with pytest.raises(lc.SessionNotFound):
                await client.state(call.session_id)


def test_speech_ended_frames_carry_what_was_played() -> None:
    if PIPECAT_MISSING:
        pytest.fail(PIPECAT_MISSING)
    cut = LipstreamSpeechEndedFrame.from_event(
        {
            "type": "speech_ended",
            "utterance": 4,
            "duration_ms": 3000.0,
            "played_ms": 1240.0,
            "interrupted": True,
        }
    )
    assert (cut.utterance, cut.played_ms, cut.duration_ms, cut.interrupted) == (
        4,
        1240.0,
        3000.0,
        True,
    )
    # From a server before playback positions: the whole utterance was played.
    older = LipstreamSpeechEndedFrame.from_event(
        {"type": "speech_ended", "utterance": 1, "duration_ms": 800.0}
    )
    assert (older.played_ms, older.interrupted) == (800.0, False)


@pytest.mark.slow
async def test_a_pipeline_switches_the_avatar_and_its_idle_clip_mid_call(
    tmp_path: Path, loopback: None
) -> None:
    if PIPECAT_MISSING:
        pytest.fail(PIPECAT_MISSING)
    small = (640, 360)
    package = write_demo_avatar(tmp_path / "avatars" / "small", count=30, size=small, seed=5)
    manifest = json.loads((package / "avatar.json").read_text())
    manifest["clips"] = {"idle": [0, 15], "thinking": [15, 30]}
    (package / "avatar.json").write_text(json.dumps(manifest))
    hello = spoken(tmp_path, "hello", "hello there, let me hand you over to my colleague")
    async with lipstream_serve(tmp_path, server={"ice_loopback_only": "true"}) as server:
        url = f"http://127.0.0.1:{server.port}"
        tts, avatar, sink = (
            FakeTts(),
            LipstreamVideoService(base_url=url, avatar="demo"),
            Sink(None),
        )
        events: list[lc.Event] = []

        @avatar.event_handler("on_avatar_changed")
        @avatar.event_handler("on_idle_clip_changed")
        @avatar.event_handler("on_speech_ended")
        async def on_event(service: LipstreamVideoService, event: lc.Event) -> None:
            events.append(event)

        def event(kind: str) -> lc.Event | None:
            return next((e for e in events if e["type"] == kind), None)

        worker = PipelineWorker(
            Pipeline([tts, avatar, sink]),
            params=PipelineParams(audio_out_sample_rate=RATE),
            enable_rtvi=False,
            idle_timeout_secs=None,
            cancel_on_idle_timeout=False,
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run(), name="pipecat-runner")
        got = sink.got
        try:
            await until(lambda: len(got.video) >= FPS, "the avatar's first second")
            await tts.say(hello)
            switched = await avatar.switch_avatar("small")
            assert (switched.previous, switched.avatar, avatar.avatar) == ("demo", "small", "small")
            frame = switched.frame
            assert frame is not None
            changed = await until(lambda: event("avatar_changed"), "on_avatar_changed")
            assert (changed["frame"], changed["frame_size"]) == (frame, list(small))
            await until(lambda: got.video[-1].index >= frame + FPS, "a second of the new avatar")
            assert {s.size for s in got.video if s.index < frame} == {(1280, 720)}
            assert {s.size for s in got.video if s.index >= frame} == {small}
            ended = await until(lambda: event("speech_ended"), "the utterance to end")
            assert ended["interrupted"] is False
            assert ended["played_ms"] == pytest.approx(len(hello) / RATE * 1000, abs=60)

            with pytest.raises(lc.NotFound):
                await avatar.switch_avatar("nobody")
            assert avatar.avatar == "small"
            assert avatar.call is not None
            chosen = await avatar.set_idle_clip("thinking")
            assert (chosen.clip, chosen.previous) == ("thinking", "idle")
            clip_changed = await until(lambda: event("idle_clip_changed"), "on_idle_clip_changed")
            assert clip_changed["clip"] == "thinking"
            with pytest.raises(lc.NotFound):
                await avatar.set_idle_clip("no-such-clip")
            shown = got.video[-1].index
            await until(lambda: got.video[-1].index >= shown + FPS, "video after the refusals")
            await worker.queue_frame(EndFrame())
            async with asyncio.timeout(TIMEOUT_S):
                await running
        finally:
            if not running.done():
                await worker.cancel()
                await running
        assert [f.utterance for f in got.played] == [1]
        assert "ErrorFrame" not in got.passed
