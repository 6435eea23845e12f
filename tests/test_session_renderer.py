"""Render tasks with a model the test answers by hand: what is kept, what is dropped and why."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import pytest

from compositor.background_cache import AvatarFrames, BackgroundCache
from compositor.clips import ClipPlan
from compositor.sequencer import FrameStep, bounce_index
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import DeadlineExceededError, QueueFullError
from inference_core.features.stream import FrameAudio
from streaming.frame_pipeline import FramePipeline
from streaming.live.avatar import CallAvatar
from streaming.live.renderer import COMPOSE_S, MAX_FRAMES_IN_FLIGHT, FrameRenderer
from streaming.live.reporting import FrameSending, FrameStages, SessionStats
from streaming.live.send_buffers import SendBuffers
from streaming.webrtc.pacing import SessionClock
from tests.packages import make_package

FPS = 25
DELAY_S = 0.5
LOOKAHEAD_MS = 212.5
START = 1000.0


class InlineExecutor(Executor):
    """Runs each job at once on the calling thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future

    def run(self, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """The :class:`~streaming.live.workers.Offload` path: the same job, inline."""
        done = asyncio.get_running_loop().create_future()
        done.set_result(self.submit(fn, *args).result())
        return done


@dataclass
class Call:
    deadline: float
    session_id: str | None
    future: asyncio.Future[np.ndarray]


class HandModel:
    """The inference core's submit: each frame waits until the test answers it."""

    def __init__(self, face_size: int) -> None:
        self.face_size = face_size
        self.calls: list[Call] = []
        self.refuse: Exception | None = None
        self._changed = asyncio.Event()

    def submit(
        self,
        visual: np.ndarray,
        audio: np.ndarray,
        *,
        deadline: float,
        session_id: str | None = None,
    ) -> asyncio.Future[np.ndarray]:
        assert visual.dtype == np.uint8
        assert visual.shape == (self.face_size, self.face_size, 3)
        if self.refuse is not None:
            raise self.refuse
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.calls.append(Call(deadline, session_id, future))
        self._changed.set()
        return future

    async def submitted(self, count: int) -> None:
        """Return once ``count`` frames have reached the model."""
        async with asyncio.timeout(10):
            while len(self.calls) < count:
                self._changed.clear()
                await self._changed.wait()

    def face(self) -> np.ndarray:
        return np.full((self.face_size, self.face_size, 3), 255, dtype=np.uint8)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> AvatarPackage:
    return AvatarPackage.load(make_package(tmp_path_factory.mktemp("avatar")))


@dataclass
class Rig:
    renderer: FrameRenderer
    model: HandModel
    buffers: SendBuffers
    stats: SessionStats
    frames: AvatarFrames
    clock: Clock
    ready: list[FrameStages]
    sent: list[FrameSending]
    failures: list[tuple[str, BaseException]]

    def submit(self, index: int) -> None:
        count = len(self.frames)
        step = FrameStep(output_index=index, avatar_index=bounce_index(index, count), alpha=1.0)
        features = np.zeros((1, 80, 16), dtype=np.float32)
        item = FrameAudio(index, features, level_db=-10.0)
        self.renderer.submit(step, item, self.renderer.start(step, item))

    def idle_frame(self, index: int) -> np.ndarray:
        return self.frames.get(bounce_index(index, len(self.frames)))


@pytest.fixture
def rig(package: AvatarPackage) -> Rig:
    frames = AvatarFrames(package.avatar_id, package.frame_paths, BackgroundCache(10_000_000))
    schedule = SessionClock(DELAY_S)
    schedule.start = START
    buffers = SendBuffers(DELAY_S, FPS)
    stats = SessionStats()
    model = HandModel(package.manifest.adapter.input_size)
    clock = Clock(START)
    ready: list[FrameStages] = []
    sent: list[FrameSending] = []
    failures: list[tuple[str, BaseException]] = []
    renderer = FrameRenderer(
        "session-1",
        CallAvatar(
            model,  # type: ignore[arg-type]
            frames,
            FramePipeline(package, frames),
            None,
            None,
            ClipPlan(package.frame_count),
        ),
        InlineExecutor(),
        schedule,
        buffers,
        stats,
        fps=FPS,
        lookahead_ms=LOOKAHEAD_MS,
        on_failure=lambda stage, exc: failures.append((stage, exc)),
        on_frame_ready=ready.append,
        on_frame_sent=sent.append,
        clock=clock,
    )
    return Rig(renderer, model, buffers, stats, frames, clock, ready, sent, failures)


async def test_a_rendered_frame_is_sent_in_its_slot(rig: Rig) -> None:
    rig.submit(10)
    await rig.model.submitted(1)
    call = rig.model.calls[0]
    send_at = START + DELAY_S + 10 / FPS
    assert call.deadline == pytest.approx(send_at - COMPOSE_S)
    assert call.session_id == "session-1"
    # Composed 150 ms after the frame's audio was complete (its time + the lookahead).
    rig.clock.now = START + 10 / FPS + LOOKAHEAD_MS / 1000 + 0.150
    call.future.set_result(rig.model.face())
    await asyncio.gather(*rig.renderer.in_flight)
    assert not rig.renderer.in_flight
    assert rig.stats.frames_inferred == 1
    assert list(rig.stats.processing_ms) == [pytest.approx(150.0)]
    assert [stages.total for stages in rig.ready] == [pytest.approx(0.150)]
    frame = await rig.renderer.frame_for(10)
    assert frame.shape == rig.idle_frame(10).shape

    assert not np.array_equal(frame, rig.idle_frame(10))  # the face is in it
    assert rig.stats.frames_dropped == {}


async def test_a_frame_past_its_deadline_costs_no_crop_and_counts_late(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    crops: list[FrameStep] = []
    pipeline = rig.renderer.avatar.pipeline
    monkeypatch.setattr(pipeline, "prepare", crops.append)
    send_at = START + DELAY_S + 10 / FPS
    rig.clock.now = send_at - COMPOSE_S + 0.001  # its features came after its deadline
    rig.submit(10)
    assert not crops
    assert not rig.renderer.in_flight
    assert not rig.model.calls
    assert rig.stats.frames_dropped == {"late": 1}


async def test_a_frames_added_delay_is_split_into_stages_that_add_up(rig: Rig) -> None:
    audio_complete = START + 10 / FPS + LOOKAHEAD_MS / 1000
    rig.clock.now = audio_complete + 0.030  # its features reached the renderer 30 ms later
    rig.submit(10)
    await rig.model.submitted(1)  # prepared at once (the executor runs inline here)
    rig.clock.now += 0.100  # the batch took 100 ms
    rig.model.calls[0].future.set_result(rig.model.face())
    await asyncio.gather(*rig.renderer.in_flight)
    added = rig.stats.added_delay()
    assert added.stages == {"features": 30.0, "prepare": 0.0, "inference": 100.0, "compose": 0.0}
    assert added.mean == pytest.approx(sum(added.stages.values()))
    assert list(rig.stats.processing_ms) == [pytest.approx(130.0)]
    # The hook (what /metrics observes) hears the same split, in seconds.
    assert rig.ready == [pytest.approx(FrameStages(0.030, 0.0, 0.100, 0.0))]
    assert rig.ready[0].total == pytest.approx(0.130)


class SlowEncoder:
    """Stands in for the sender's H.264 encoder: each encode takes 5 ms of the rig's clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.images: list[np.ndarray] = []

    def sends(self, index: int) -> bool:
        return True  # every frame: the full frame rate

    def encode_packet(self, frame: av.VideoFrame) -> av.Packet:
        self.images.append(frame.to_ndarray())
        self.clock.now += 0.005
        return av.Packet(b"")


async def test_a_sent_frame_records_its_wait_for_the_slot_and_its_encode(rig: Rig) -> None:
    rig.submit(10)
    await rig.model.submitted(1)
    ready_at = START + 10 / FPS + LOOKAHEAD_MS / 1000 + 0.020
    rig.clock.now = ready_at
    rig.model.calls[0].future.set_result(rig.model.face())
    await asyncio.gather(*rig.renderer.in_flight)
    encoder = SlowEncoder(rig.clock)
    rig.clock.now = ready_at + 0.060  # its slot came 60 ms later
    await rig.renderer.packet_for(10, encoder)  # type: ignore[arg-type]
    assert rig.sent == [pytest.approx(FrameSending(slot_wait=0.060, encode=0.005))]
    assert rig.stats.added_delay().sending == {"slot_wait": 60.0, "encode": 5.0}
    # An idle frame is encoded too, but it has no added delay to follow.
    await rig.renderer.packet_for(11, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 2
    assert len(rig.sent) == 1


async def test_known_frames_are_encoded_ahead_and_leave_at_their_slot(rig: Rig) -> None:
    rig.submit(10)
    rig.submit(11)
    await rig.model.submitted(2)
    ready_at = START + 11 / FPS + LOOKAHEAD_MS / 1000 + 0.020
    rig.clock.now = ready_at
    for call in rig.model.calls:
        call.future.set_result(rig.model.face())
    await asyncio.gather(*rig.renderer.in_flight)
    encoder = SlowEncoder(rig.clock)
    rig.clock.now = ready_at + 0.020  # slot 10
    await rig.renderer.packet_for(10, encoder)  # type: ignore[arg-type]
    # 11 is composed: its encode starts as soon as 10 is out, not at its own slot.
    assert len(encoder.images) == 2
    rig.clock.now += 0.040  # slot 11
    await rig.renderer.packet_for(11, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 2  # handed over, nothing encoded now
    assert rig.sent[1].encode == 0.0  # it left at its slot
    assert not np.array_equal(encoder.images[1], encoder.images[0])
    # An idle frame is encoded ahead once the speech gate has decided it, not before
    # (a frame it has not reached may still be inferred).
    await rig.renderer.packet_for(12, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 3
    rig.renderer.decided_until(20)
    await rig.renderer.packet_for(13, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 5  # 13 at its slot, then 14 ahead
    # Slots 14 and 15 skipped (a late track): the frame encoded ahead still goes (the
    # decoder needs every frame the encoder made), then encoding resumes at 17.
    await rig.renderer.packet_for(16, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 6
    ahead = rig.renderer.in_flight
    assert len(ahead) == 1  # frame 17's encode
    await rig.renderer.packet_for(17, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 7  # 18 ahead; 17 was handed over
    assert len(rig.sent) == 2  # only 10 and 11 were lip-synced


async def test_a_frame_composed_after_the_one_before_went_out_is_encoded_at_once(
    rig: Rig,
) -> None:
    rig.submit(11)
    await rig.model.submitted(1)
    encoder = SlowEncoder(rig.clock)
    await rig.renderer.packet_for(10, encoder)  # type: ignore[arg-type]
    # 10 went out idle; 11, still in flight, was not encoded ahead
    assert len(encoder.images) == 1
    rig.model.calls[0].future.set_result(rig.model.face())
    await asyncio.gather(*rig.renderer.in_flight)  # composed: its encode starts now
    assert len(encoder.images) == 2
    await rig.renderer.packet_for(11, encoder)  # type: ignore[arg-type]
    assert len(encoder.images) == 2
    assert rig.sent[0].encode == 0.0


async def test_a_slot_without_a_frame_shows_the_idle_frame(rig: Rig) -> None:
    for index in (0, 7, 13):
        frame = await rig.renderer.frame_for(index)
        assert frame is rig.idle_frame(index)  # the cached background, no copy
    assert rig.stats.frames_dropped == {}  # nothing was being rendered for them


async def test_at_most_max_frames_in_flight(rig: Rig) -> None:
    for index in range(MAX_FRAMES_IN_FLIGHT + 2):
        rig.submit(index)
    assert len(rig.renderer.in_flight) == MAX_FRAMES_IN_FLIGHT
    assert rig.stats.frames_dropped == {"overload": 2}
    await rig.model.submitted(MAX_FRAMES_IN_FLIGHT)
    first = next(t for t in rig.renderer.in_flight if t.get_name() == "frame-0")
    rig.model.calls[0].future.set_result(rig.model.face())
    await first
    assert len(rig.renderer.in_flight) == MAX_FRAMES_IN_FLIGHT - 1
    rig.submit(20)  # room again
    assert len(rig.renderer.in_flight) == MAX_FRAMES_IN_FLIGHT
    assert rig.stats.frames_dropped == {"overload": 2}
    assert len(rig.model.calls) == MAX_FRAMES_IN_FLIGHT  # the overloaded ones never ran


async def test_a_frame_still_in_flight_at_its_slot_is_not_ready_and_counted_once(
    rig: Rig,
) -> None:
    rig.submit(5)
    rig.submit(6)
    await rig.model.submitted(2)
    frame = await rig.renderer.frame_for(5)  # the slot comes: the idle frame goes out
    assert frame is rig.idle_frame(5)
    await rig.renderer.frame_for(6)
    assert rig.stats.frames_dropped == {"not_ready": 2}
    rig.model.calls[0].future.set_result(rig.model.face())  # composed too late
    rig.model.calls[1].future.set_exception(DeadlineExceededError("frame 6 missed it"))
    await asyncio.gather(*rig.renderer.in_flight)
    # One frame, one reason: its slot came first (dropped totals never exceed frames).
    assert rig.stats.frames_dropped == {"not_ready": 2}
    assert rig.stats.frames_inferred == 0
    assert rig.buffers.sizes().frames == 0  # not kept for a slot that is gone
    assert rig.ready == []


async def test_inference_errors_are_counted_by_class_name(rig: Rig) -> None:
    rig.submit(1)
    await rig.model.submitted(1)
    rig.model.calls[0].future.set_exception(DeadlineExceededError("frame 1 missed it"))
    rig.model.refuse = QueueFullError("queue full")  # submit raises at once
    rig.submit(2)
    await asyncio.gather(*rig.renderer.in_flight)
    assert rig.stats.frames_dropped == {"DeadlineExceededError": 1, "QueueFullError": 1}
    assert rig.stats.frames_inferred == 0
    assert rig.buffers.sizes().frames == 0
    assert rig.failures == []  # a frame the core could not serve is a drop, not a fault


async def test_any_other_render_error_is_counted_once_and_fails_the_render_stage(
    rig: Rig,
) -> None:
    rig.submit(1)
    rig.submit(2)
    await rig.model.submitted(2)
    broken = ValueError("a face of the wrong shape")
    rig.model.calls[0].future.set_result(np.zeros((3, 3, 3), np.uint8))  # compose fails
    rig.model.calls[1].future.set_exception(broken)  # not an InferenceError
    tasks = list(rig.renderer.in_flight)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert [stage for stage, _ in rig.failures] == ["render", "render"]
    assert rig.failures[1][1] is broken
    assert rig.stats.frames_dropped == {"error": 2}  # each frame once
    assert rig.stats.frames_inferred == 0
    # Every task's exception was retrieved: none is left for the loop to warn about.
    assert all(task.done() for task in tasks)


async def test_cancel_stops_every_frame_in_flight(rig: Rig) -> None:
    for index in range(3):
        rig.submit(index)
    await rig.model.submitted(3)
    tasks = list(rig.renderer.in_flight)
    rig.renderer.cancel()
    async with asyncio.timeout(10):  # a task not cancelled would wait for its face forever
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert not rig.renderer.in_flight
    assert rig.stats.frames_dropped == {}  # an interrupt is not a drop
    assert rig.stats.frames_inferred == 0
    assert rig.buffers.sizes().frames == 0
