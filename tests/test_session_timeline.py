"""The audio timeline on a hand-stepped clock: chunk due times, catching up, interrupts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compositor.sequencer import FrameSequencer, FrameStep
from inference_core.features.encoder import AudioEncoder
from inference_core.features.stream import NO_FEATURES, AudioFeatureStream, FrameAudio
from inference_core.features.timing import lookahead_ms
from streaming.audio_in.resample import MonoResampler
from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES, FEATURE_RATE, OUT_RATE
from streaming.live.mixer import AudioMixer
from streaming.live.send_buffers import SendBuffers
from streaming.live.timeline import (
    MAX_CHUNKS_PER_JOB,
    MAX_SILENT_DEFERRED,
    MAX_SILENT_NAP,
    AudioTimeline,
    DecidedFrame,
    chunk_due,
)
from streaming.webrtc.tracks import SILENCE
from tests.test_audio_features import CountingEncoder, linear_encoder

FPS = 25
START = 100.0
LOOKAHEAD_MS = lookahead_ms(0, FPS, kind="mel")  # 212.5
THRESHOLD_DB = -45.0


class ManualTime:
    """The timeline's clock and sleep; time moves only when the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.sleeps: list[float] = []
        self._wake_at = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._sleeping: asyncio.Future[None] | None = None  # the wake of a plain sleep
        self._asleep = asyncio.Event()
        self.naps = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._wake_at = self.now + seconds
        self._wake = self._sleeping = asyncio.get_running_loop().create_future()
        self._asleep.set()
        await self._wake

    async def nap(self, seconds: float, woken: asyncio.Future[None]) -> None:
        """The timeline's nap: a sleep that ``woken`` may end first."""
        self.sleeps.append(seconds)
        self.naps += 1
        self._wake_at = self.now + seconds
        self._wake = woken
        self._asleep.set()
        await woken

    @property
    def napping(self) -> bool:
        return self._wake is not None and self._wake is not self._sleeping

    async def until_asleep(self) -> None:
        """Return once the timeline waits for time to pass."""
        async with asyncio.timeout(10):
            await self._asleep.wait()

    async def advance_to(self, now: float) -> None:
        """Move time to ``now``; if that ends the timeline's sleep, let it make what is
        due and return once it sleeps again."""
        self.now = now
        if self._wake is None or now < self._wake_at:
            return
        wake, self._wake = self._wake, None
        self._asleep.clear()
        if not wake.done():
            wake.set_result(None)
        await self.until_asleep()

    async def woken_by(self, event: Callable[[], object]) -> None:
        """Run ``event`` (sound, a switch); if the timeline was napping, return once it
        has woken, made what was due and gone back to sleep."""
        napping = self.napping
        if napping:
            self._asleep.clear()
            self._wake = None
        event()
        if napping:
            await self.until_asleep()


class InlineExecutor(Executor):
    """Runs each job at once on the calling thread; ``before_next`` runs first, once."""

    def __init__(self) -> None:
        self.before_next: Callable[[], object] | None = None
        self.jobs = 0
        self.in_job = False  # a job is running (on a worker, in production)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.before_next is not None:
            hook, self.before_next = self.before_next, None
            hook()
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future

    def run(self, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """The :class:`~streaming.live.workers.Offload` path: the same job, inline."""
        self.jobs += 1
        done = asyncio.get_running_loop().create_future()
        self.in_job = True
        try:
            done.set_result(self.submit(fn, *args).result())
        finally:
            self.in_job = False
        return done


@dataclass
class Rig:
    timeline: AudioTimeline[int]
    time: ManualTime
    mixer: AudioMixer
    buffers: SendBuffers
    executor: InlineExecutor
    inferred: list[FrameStep] = field(default_factory=list)
    voiced: list[float] = field(default_factory=list)
    decided: list[DecidedFrame[int]] = field(default_factory=list)
    ticked: int = 0  # chunk due times tick_to has moved through

    async def run_to(self, chunks: int) -> None:
        """Let the timeline make chunks .. ``chunks`` - 1 (late ones caught up at once)."""
        await self.time.advance_to(chunk_due(START, chunks - 1))
        assert self.timeline.chunks_made == chunks

    async def tick_to(self, chunks: int) -> None:
        """Move time to chunk ``chunks`` - 1's due time through every chunk's due time
        since the last call; a napping timeline makes its chunks when its nap ends."""
        for index in range(self.ticked, chunks):
            await self.time.advance_to(chunk_due(START, index))
        self.ticked = max(self.ticked, chunks)
        made = self.timeline.chunks_made
        assert chunks - MAX_SILENT_NAP < made <= chunks


@contextlib.asynccontextmanager
async def running(
    features: AudioFeatureStream, hangover: int = 0, *, defer: bool = False
) -> AsyncIterator[Rig]:
    """A timeline over ``features`` on a hand-stepped clock, its jobs consumed as the live
    pipeline does."""
    time = ManualTime(START)
    mixer = AudioMixer()
    buffers = SendBuffers(delay_s=0.5, fps=FPS)
    executor = InlineExecutor()
    inferred: list[FrameStep] = []
    voiced: list[float] = []
    decided: list[DecidedFrame[int]] = []

    def start(step: FrameStep, item: FrameAudio) -> int:
        assert executor.in_job  # the renderer crops here: off the loop, in the chunk's job
        return item.index

    timeline: AudioTimeline[int] = AudioTimeline(
        mixer,
        features,
        # No fade (and by default no hangover): a frame is inferred exactly when it is loud.
        FrameSequencer(6, threshold_db=THRESHOLD_DB, hangover_frames=hangover, blend_frames=0),
        executor,
        fps=FPS,
        lookahead_ms=features.lookahead_ms,
        vad_threshold_db=THRESHOLD_DB,
        prepare=start,
        defer_silence=lambda: defer,
        clock=time.clock,
        sleep=time.sleep,
        nap=time.nap,
    )

    async def consume() -> None:
        """What the live pipeline does with each job's output (streaming/live/pipeline.py)."""
        async for made in timeline.jobs(START):
            for index, packet in enumerate(made.packets, made.first):
                buffers.put_chunk(index, packet)
            decided.extend(made.frames)
            for frame in made.frames:
                if frame.voiced:
                    voiced.append(time.now)
                if frame.step.infer:
                    assert frame.step.output_index == frame.item.index
                    assert frame.started == frame.item.index  # what start() returned
                    inferred.append(frame.step)

    task = asyncio.create_task(consume())
    await time.until_asleep()
    yield Rig(timeline, time, mixer, buffers, executor, inferred, voiced, decided)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running(AudioFeatureStream(None, kind="mel", fps=FPS)) as made:
        yield made


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(round(seconds * OUT_RATE)) / OUT_RATE
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_chunk_i_is_due_at_the_end_of_its_interval() -> None:
    assert chunk_due(START, 0) == START + AUDIO_CHUNK_S
    assert chunk_due(START, 49) == pytest.approx(START + 1.0)
    assert chunk_due(START, 50) - chunk_due(START, 49) == pytest.approx(AUDIO_CHUNK_S)


async def test_one_chunk_per_tick_at_its_due_time(rig: Rig) -> None:
    assert rig.time.sleeps == [pytest.approx(AUDIO_CHUNK_S)]  # chunk 0 waits for its audio
    await rig.time.advance_to(chunk_due(START, 0) - 0.001)
    assert rig.timeline.chunks_made == 0  # not before it is due
    await rig.time.advance_to(chunk_due(START, 0))
    assert rig.timeline.chunks_made == 1
    for index in range(1, 10):
        await rig.time.advance_to(chunk_due(START, index))
        assert rig.timeline.chunks_made == index + 1
    assert rig.time.sleeps == [pytest.approx(AUDIO_CHUNK_S)] * 11
    for index in range(10):  # each chunk's packet waits for its slot, stamped with it
        assert rig.buffers.take_chunk(index).pts == index * CHUNK_SAMPLES


async def test_a_late_tick_catches_up_without_building_delay(rig: Rig) -> None:
    await rig.run_to(1)
    jobs = rig.executor.jobs
    # The loop stalls for 180 ms: chunks 1..9 are due by then and made at once, in one
    # job (one round trip to the workers, however many chunks it takes to catch up).
    await rig.time.advance_to(chunk_due(START, 9))
    assert rig.timeline.chunks_made == 10
    assert rig.executor.jobs == jobs + 1
    assert len(rig.time.sleeps) == 3  # no sleep between the chunks that were due
    for index in range(10):  # each one made, in order, for its own slot
        assert rig.buffers.take_chunk(index).pts == index * CHUNK_SAMPLES
    # The next chunk waits for its own due time, not 20 ms from the late one.
    await rig.time.advance_to(chunk_due(START, 10) + 0.005)
    assert rig.timeline.chunks_made == 11
    assert rig.time.sleeps[-1] == pytest.approx(AUDIO_CHUNK_S - 0.005)


async def test_a_long_stall_is_caught_up_in_jobs_of_at_most_25_chunks(rig: Rig) -> None:
    rig.mixer.push(_tone(2.0))
    await rig.run_to(1)
    jobs = rig.executor.jobs
    await rig.time.advance_to(chunk_due(START, 60))  # 1.2 s behind
    assert rig.timeline.chunks_made == 61
    assert rig.executor.jobs == jobs + 3  # 25 + 25 + 10
    assert MAX_CHUNKS_PER_JOB == 25


async def test_loud_frames_are_rendered_and_quiet_ones_are_not(rig: Rig) -> None:
    rig.mixer.push(_tone(1.0))  # frames 0..24 loud, then silence
    await rig.run_to(150)  # 3 s: every frame of the tone and a second after it is final
    indices = [step.output_index for step in rig.inferred]
    assert indices == list(range(len(indices)))  # from frame 0, in order, no gap
    assert 24 <= len(indices) <= 26  # about the 1 s of tone (frames share edge audio)
    assert len(rig.voiced) == len(indices)


async def test_interrupt_drops_queued_audio_and_silences_frames_that_may_hold_it(
    rig: Rig,
) -> None:
    rig.mixer.push(_tone(2.0))
    await rig.run_to(50)  # 1 s of the tone made
    before = [step.output_index for step in rig.inferred]
    assert before == list(range(len(before)))
    assert before  # some frames were final and went to rendering

    dropped, cut = rig.timeline.interrupt()
    assert dropped == pytest.approx(1.0)  # the second not made yet
    assert cut == [1]  # the tone, half played, was cut short
    assert rig.mixer.pushed_seconds == 0.0
    # Audio heard by now plus the feature lookahead reaches into frame 30.
    silent_until = int((50 * AUDIO_CHUNK_S + LOOKAHEAD_MS / 1000) * FPS) + 1
    assert silent_until == 31

    rig.mixer.push(_tone(2.0))  # new speech right away
    voiced_before = len(rig.voiced)
    await rig.run_to(200)
    after = [step.output_index for step in rig.inferred[len(before) :]]
    # Frames made from audio before the interrupt (up to 31) show idle though the new
    # speech is loud from frame 25 on; the new speech is rendered from frame 32.
    assert after[0] == silent_until + 1
    assert after == list(range(after[0], after[0] + len(after)))
    assert len(rig.voiced) - voiced_before == len(after)


async def test_a_chunk_encoded_during_an_interrupt_is_silenced(rig: Rig) -> None:
    rig.mixer.push(_tone(1.0))
    await rig.run_to(10)
    assert bytes(rig.buffers.take_chunk(9)) != SILENCE
    rig.executor.before_next = rig.timeline.interrupt  # lands while chunk 10 is encoded
    await rig.run_to(11)
    assert bytes(rig.buffers.take_chunk(10)) == SILENCE
    rig.mixer.push(_tone(1.0))
    await rig.run_to(12)
    assert bytes(rig.buffers.take_chunk(11)) != SILENCE  # new audio is heard again


async def test_a_listening_call_runs_no_audio_encoder_and_speech_gets_its_features(
    tmp_path: Path,
) -> None:
    """Idle frames cost no encoder run; the frames of speech get the features an ungated
    stream of the same audio gives, bit for bit."""
    counting = CountingEncoder.from_path(linear_encoder(tmp_path / "encoder.onnx"))
    assert isinstance(counting, CountingEncoder)
    async with running(AudioFeatureStream(counting, fps=FPS), hangover=4) as ave:
        await ave.run_to(250)  # 5 s of a listening call
        assert len(ave.decided) > 100
        assert counting.windows == 0
        assert all(f.item.features is NO_FEATURES for f in ave.decided)
        ave.mixer.push(_tone(1.0))
        await ave.run_to(400)  # the tone and 2 s after it are final
    # The timeline's 400 chunks: 250 silent ones, the tone, silence; the reference stream
    # gets them as the timeline's job does, resampled chunk by chunk and ungated.
    timeline_audio = np.concatenate(
        (np.zeros(250 * CHUNK_SAMPLES, np.float32), _tone(1.0), np.zeros(100 * CHUNK_SAMPLES))
    ).astype(np.float32)
    reference = AudioFeatureStream(AudioEncoder.from_path(tmp_path / "encoder.onnx"), fps=FPS)
    resampler = MonoResampler(OUT_RATE, FEATURE_RATE)
    want: dict[int, FrameAudio] = {}
    for i in range(400):
        chunk = timeline_audio[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
        want.update((f.index, f) for f in reference.push(resampler.push(chunk)))
    inferred = [f for f in ave.decided if f.step.infer]
    assert 25 <= len(inferred) <= 32
    for frame in ave.decided:
        if frame.step.infer:
            np.testing.assert_array_equal(frame.item.features, want[frame.item.index].features)
        else:
            assert frame.item.features is NO_FEATURES
    assert counting.windows <= len(inferred) + 16 + 2


def _same_frames(got: list[DecidedFrame[int]], want: list[DecidedFrame[int]]) -> None:
    assert [(f.item.index, f.step, f.voiced, f.started) for f in got] == [
        (f.item.index, f.step, f.voiced, f.started) for f in want
    ]
    for a, b in zip(got, want, strict=True):
        assert a.item.level_db == b.item.level_db
        if b.item.features is NO_FEATURES:
            assert a.item.features is NO_FEATURES
        else:
            np.testing.assert_array_equal(a.item.features, b.item.features)


async def test_a_listening_call_puts_off_its_silent_chunks_and_speech_finds_them_made(
    tmp_path: Path,
) -> None:
    """A timeline that puts off its silent chunks (module doc) makes the same packets
    and decides the same frames, with the same features, as one that makes every chunk in
    its own job; it runs a job per ``MAX_SILENT_DEFERRED + 1`` chunks while silent, and
    the first chunk of sound runs one at once, so speech is decided no later."""
    path = linear_encoder(tmp_path / "encoder.onnx")

    def stream() -> AudioFeatureStream:
        return AudioFeatureStream(AudioEncoder.from_path(path), fps=FPS)

    async with (
        running(stream(), hangover=4, defer=True) as lazy,
        running(stream(), hangover=4) as eager,
    ):
        rigs = (lazy, eager)

        async def tick_to(chunks: int) -> None:
            for rig in rigs:
                await rig.tick_to(chunks)

        await tick_to(20)  # the first chunks: the lookahead and the gate are not settled
        assert lazy.executor.jobs == eager.executor.jobs
        await tick_to(300)  # 6 s of a listening call
        assert eager.executor.jobs == 300
        # After at most a second's settling, one job per MAX_SILENT_DEFERRED + 1 chunks.
        assert lazy.executor.jobs <= 70 + 230 / (MAX_SILENT_DEFERRED + 1) + 1
        # Frames it has not decided yet are at most the put-off chunks' worth.
        behind = eager.decided[-1].item.index - lazy.decided[-1].item.index
        assert 0 <= behind <= MAX_SILENT_DEFERRED * AUDIO_CHUNK_S * FPS + 1
        jobs = lazy.executor.jobs
        for rig in rigs:  # the sound wakes the napping timeline: it makes what is due
            await rig.time.woken_by(lambda rig=rig: rig.mixer.push(_tone(1.0)))
        assert not lazy.time.napping
        await tick_to(301)  # the first chunk of sound: its job makes the silence first
        assert lazy.timeline.chunks_made == eager.timeline.chunks_made == 301
        assert lazy.executor.jobs == jobs + 1
        assert lazy.decided[-1].item.index == eager.decided[-1].item.index
        _same_frames(lazy.decided, eager.decided)
        await tick_to(500)  # the tone, and 3 s of silence after it
        assert lazy.time.naps > 20
        for index in range(lazy.timeline.chunks_made):
            a, b = lazy.buffers.take_chunk(index), eager.buffers.take_chunk(index)
            assert (bytes(a), a.pts) == (bytes(b), b.pts)
        assert lazy.executor.jobs < eager.executor.jobs - 100  # silent again, put off again
        for rig in rigs:  # a last sound: every frame before it is decided in both
            await rig.time.woken_by(lambda rig=rig: rig.mixer.push(_tone(0.1)))
        await tick_to(501)
        assert lazy.timeline.chunks_made == eager.timeline.chunks_made == 501
    _same_frames(lazy.decided, eager.decided)
    assert 25 <= len(lazy.inferred) <= 40


async def test_sound_wakes_a_napping_timeline_and_is_made_at_its_own_due_time() -> None:
    async with running(AudioFeatureStream(None, kind="mel", fps=FPS), defer=True) as rig:
        await rig.tick_to(60)
        while not (rig.time.napping and rig.timeline.chunks_made < rig.ticked):
            await rig.tick_to(rig.ticked + 1)
        assert rig.time.naps > 0
        now = rig.ticked  # time is chunk now - 1's due time; the nap has not made it yet
        jobs = rig.executor.jobs
        await rig.time.woken_by(lambda: rig.mixer.push(_tone(0.5)))
        assert rig.timeline.chunks_made == now  # what was due, made at once
        assert not rig.time.napping
        await rig.tick_to(now + 1)  # the chunk with the tone: a job at its due time
        assert rig.timeline.chunks_made == now + 1
        assert rig.executor.jobs == jobs + 1
        assert bytes(rig.buffers.take_chunk(now - 1)) == SILENCE
        assert bytes(rig.buffers.take_chunk(now)) != SILENCE


async def test_an_interrupt_or_a_call_without_a_shared_loop_puts_nothing_off(
    tmp_path: Path,
) -> None:
    async with running(AudioFeatureStream(None, kind="mel", fps=FPS), defer=True) as rig:
        await rig.tick_to(100)
        assert rig.executor.jobs < 80  # settled and putting silence off
        jobs = rig.executor.jobs
        await rig.time.woken_by(rig.timeline.interrupt)  # the next job resets the gate
        await rig.tick_to(101)
        assert rig.executor.jobs == jobs + 1
    async with running(AudioFeatureStream(None, kind="mel", fps=FPS)) as rig:
        await rig.tick_to(100)
        assert rig.executor.jobs == 100
