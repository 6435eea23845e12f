"""DeviceScheduler: cross-session batching, deadlines, full queue, failures, shutdown, stats.

Real worker threads throughout. Runners are fakes that record their batches (one test
uses a real onnxruntime session). Runners can be held on a gate so frames pile up while
the only worker is busy, which makes batch contents deterministic; deadlines run on a
fake clock where a test needs them to pass at a known moment.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from inference_core.exceptions import (
    DeadlineExceededError,
    InferenceError,
    ModelInputError,
    QueueFullError,
    ShuttingDownError,
)
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.scheduler import DeviceScheduler
from inference_core.serving.scheduler_stats import SchedulerStats
from tests.onnx_builders import tiny_lipsync

DEVICE = "cpu:0"
FAR = 1_000.0  # seconds: a deadline no test reaches


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingRunner:
    """Records every batch; returns each request's ``visual`` as its output.

    With a ``gate`` every batch waits for it, so frames pile up behind a busy worker.
    ``errors`` are raised (or, for a list, returned) by the first calls, one per call.
    """

    def __init__(
        self,
        model_id: str,
        *,
        max_batch_size: int = 8,
        gate: threading.Event | None = None,
        calls: list[str] | None = None,
        errors: Sequence[BaseException | list[np.ndarray]] = (),
    ) -> None:
        self._model_id = model_id
        self._max_batch_size = max_batch_size
        self.gate = gate
        self.calls = calls
        self.errors = list(errors)
        self.batches: list[list[FrameRequest]] = []
        self.queue_waits: list[tuple[int, float]] = []  # (frames, seconds) per batch
        self.started = threading.Event()
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        with self._lock:
            self.batches.append(list(requests))
            if self.calls is not None:
                self.calls.append(self._model_id)
            planned = self.errors.pop(0) if self.errors else None
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(0.001)  # a little compute, so other threads get to run meanwhile
        if isinstance(planned, BaseException):
            raise planned
        if planned is not None:
            return planned
        return [r.visual.copy() for r in requests]

    def count_queue_wait(self, frames: int, seconds: float) -> None:
        with self._lock:
            self.queue_waits.append((frames, seconds))


class Harness:
    """Builds schedulers and gates for a test and tears them down, whatever happened."""

    def __init__(self) -> None:
        self.schedulers: list[DeviceScheduler] = []
        self.gates: list[threading.Event] = []

    def scheduler(
        self,
        *,
        workers: int = 1,
        queue_size: int = 64,
        max_batch_size: int = 4,
        max_wait_ms: float = 0.0,
        clock: FakeClock | None = None,
    ) -> DeviceScheduler:
        scheduler = DeviceScheduler(
            DEVICE,
            workers=workers,
            queue_size=queue_size,
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            clock=clock or time.monotonic,
        )
        scheduler.start()
        self.schedulers.append(scheduler)
        return scheduler

    def gate(self) -> threading.Event:
        gate = threading.Event()
        self.gates.append(gate)
        return gate

    def close(self) -> None:
        for gate in self.gates:
            gate.set()
        for scheduler in self.schedulers:
            scheduler.stop(timeout=10)


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()
    assert not scheduler_threads()


def scheduler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"lipstream-{DEVICE}-")]


def frame(
    model_id: str, deadline: float, *, session: str | None = None, value: int = 0
) -> FrameRequest:
    loop = asyncio.get_running_loop()
    return FrameRequest(
        model_id=model_id,
        visual=np.array([value], dtype=np.int64),
        audio=np.zeros(1, dtype=np.float32),
        deadline=deadline,
        future=loop.create_future(),
        loop=loop,
        session_id=session,
    )


async def wait_started(runner: RecordingRunner) -> None:
    assert await asyncio.to_thread(runner.started.wait, 10), "runner never started"


async def until_holding(scheduler: DeviceScheduler) -> None:
    """Wait until every worker has looked at every queued frame and chose to wait."""
    async with asyncio.timeout(10):
        while not scheduler.holding:  # noqa: ASYNC110 - test polling
            await asyncio.sleep(0.01)


async def settle(requests: Sequence[FrameRequest]) -> list[np.ndarray | BaseException]:
    futures = [r.future for r in requests]
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)


def assert_stats_add_up(stats: SchedulerStats) -> None:
    accounted = (
        stats.completed
        + stats.expired
        + stats.failed
        + stats.shut_down
        + stats.dropped
        + stats.queue_depth
        + stats.in_flight
    )
    assert stats.submitted == accounted
    frames_run = stats.completed + stats.failed
    assert sum(stats.batch_sizes.values()) == stats.batches
    assert sum(size * n for size, n in stats.batch_sizes.items()) == frames_run
    assert sum(w.batches for w in stats.workers) == stats.batches
    assert sum(w.frames for w in stats.workers) == frames_run
    assert sum(m.batches for m in stats.models.values()) == stats.batches
    assert sum(m.frames for m in stats.models.values()) == stats.completed
    assert sum(m.failed for m in stats.models.values()) == stats.failed
    assert sum(m.expired for m in stats.models.values()) == stats.expired


async def test_batches_mix_sessions_in_deadline_order(harness: Harness) -> None:
    clock = FakeClock()
    scheduler = harness.scheduler(max_batch_size=4, clock=clock)
    runner = RecordingRunner("m", max_batch_size=8, gate=harness.gate())
    first = frame("m", clock.now + FAR, session="warm-up")
    scheduler.submit(first, runner)
    await wait_started(runner)  # the only worker is busy: everything below piles up
    sessions = [f"s{s}" for s in range(4)]
    queued = [
        frame("m", clock.now + 1 + 0.04 * i + 0.001 * s, session=sessions[s], value=10 * s + i)
        for s in range(4)
        for i in range(3)
    ]
    for request in queued:
        scheduler.submit(request, runner)
    assert scheduler.pending_for("m") == 12
    assert runner.gate is not None
    runner.gate.set()

    results = await settle([first, *queued])

    for request, result in zip([first, *queued], results, strict=True):
        assert isinstance(result, np.ndarray)
        np.testing.assert_array_equal(result, request.visual)
    later = runner.batches[1:]
    assert [len(b) for b in later] == [4, 4, 4]  # scheduler limit, below the runner's 8
    for batch in later:
        assert {r.session_id for r in batch} == set(sessions)
        assert [r.deadline for r in batch] == sorted(r.deadline for r in batch)
    assert [r.deadline for b in later for r in b] == sorted(r.deadline for r in queued)
    assert scheduler.stats().batch_sizes == {1: 1, 4: 3}


async def test_runner_with_batch_limit_one_gets_single_frames(harness: Harness) -> None:
    scheduler = harness.scheduler(max_batch_size=8)
    runner = RecordingRunner("single", max_batch_size=1, gate=harness.gate())
    first = frame("single", time.monotonic() + FAR)
    scheduler.submit(first, runner)
    await wait_started(runner)
    queued = [frame("single", time.monotonic() + FAR, session=f"s{i}") for i in range(5)]
    for request in queued:
        scheduler.submit(request, runner)
    assert runner.gate is not None
    runner.gate.set()

    await settle([first, *queued])

    assert [len(b) for b in runner.batches] == [1] * 6
    assert scheduler.stats().batch_sizes == {1: 6}


async def test_lone_frame_runs_alone_after_max_wait(harness: Harness) -> None:
    scheduler = harness.scheduler(max_wait_ms=20)
    runner = RecordingRunner("m")
    request = frame("m", time.monotonic() + FAR)
    scheduler.submit(request, runner)

    [result] = await settle([request])

    assert isinstance(result, np.ndarray)
    assert runner.batches == [[request]]


async def test_batching_window_waits_for_a_session_that_is_due_then_times_out(
    harness: Harness,
) -> None:
    clock = FakeClock()  # frozen: the window ends only when the test advances the clock
    scheduler = harness.scheduler(workers=2, max_batch_size=4, max_wait_ms=200, clock=clock)
    runner = RecordingRunner("m")
    # Two rounds at 25 fps teach the scheduler each session's rhythm.
    for _ in range(2):
        warm = [frame("m", clock.now + FAR, session=f"s{i}") for i in range(4)]
        for request in warm:
            scheduler.submit(request, runner)
        await settle(warm)
        clock.advance(0.04)
    runner.batches.clear()

    first_three = [frame("m", clock.now + FAR, session=f"s{i}") for i in range(3)]
    for request in first_three:
        scheduler.submit(request, runner)
    await until_holding(scheduler)
    assert scheduler.pending_for("m") == 3  # s3 is due now: the batch waits for it
    fourth = frame("m", clock.now + FAR, session="s3")
    scheduler.submit(fourth, runner)  # the batch is full now

    await settle([*first_three, fourth])
    assert runner.batches == [[*first_three, fourth]]

    straggler = frame("m", clock.now + FAR)  # no session: the plain window applies
    scheduler.submit(straggler, runner)
    await until_holding(scheduler)
    assert scheduler.pending_for("m") == 1
    clock.advance(0.3)  # past max_wait: it runs alone
    await settle([straggler])
    assert runner.batches[1:] == [[straggler]]


async def test_holding_means_every_worker_chose_to_wait(harness: Harness) -> None:
    clock = FakeClock()  # frozen: an open batching window stays open
    scheduler = harness.scheduler(workers=2, max_wait_ms=50, clock=clock)
    await until_holding(scheduler)  # idle: nothing to look at
    busy = RecordingRunner("busy", max_batch_size=1, gate=harness.gate())
    running = frame("busy", clock.now + FAR)
    scheduler.submit(running, busy)  # a full batch of one: it runs at once
    await wait_started(busy)
    held = frame("m", clock.now + FAR)
    scheduler.submit(held, RecordingRunner("m"))
    assert not scheduler.holding  # one worker is still busy with "busy"
    assert busy.gate is not None
    busy.gate.set()
    await settle([running])
    await until_holding(scheduler)
    assert scheduler.pending_for("m") == 1  # both workers saw it and left it in its window
    await asyncio.to_thread(scheduler.stop, 10)
    assert not scheduler.holding
    assert isinstance((await settle([held]))[0], ShuttingDownError)


async def test_frames_do_not_wait_for_partners_that_are_not_due(harness: Harness) -> None:
    clock = FakeClock()  # frozen: a frame that waited for the window would never run
    scheduler = harness.scheduler(max_batch_size=4, max_wait_ms=10, clock=clock)
    runner = RecordingRunner("m")
    for _ in range(4):  # two calls at 25 fps, 20 ms apart: the partner is never 10 ms away
        for session in ("a", "b"):
            request = frame("m", clock.now + FAR, session=session)
            scheduler.submit(request, runner)
            await settle([request])  # settle() gives up after a few seconds
            clock.advance(0.02)
    assert [len(batch) for batch in runner.batches] == [1] * 8


async def test_batching_window_ends_at_the_frame_deadline(harness: Harness) -> None:
    clock = FakeClock()
    scheduler = harness.scheduler(max_wait_ms=60_000, clock=clock)
    runner = RecordingRunner("m")
    request = frame("m", clock.now + 0.05)
    scheduler.submit(request, runner)
    clock.advance(0.05)  # the window is a minute long, but the deadline is now

    [result] = await settle([request])

    assert isinstance(result, np.ndarray)
    assert runner.batches == [[request]]


async def test_model_with_earliest_deadline_runs_first(harness: Harness) -> None:
    clock = FakeClock()
    scheduler = harness.scheduler(max_wait_ms=1, clock=clock)
    calls: list[str] = []
    blocker = RecordingRunner("busy", gate=harness.gate(), calls=calls)
    late = RecordingRunner("late", calls=calls)
    early = RecordingRunner("early", calls=calls)
    first = frame("busy", clock.now + FAR)
    scheduler.submit(first, blocker)
    clock.advance(0.01)  # its batching window is over
    await wait_started(blocker)
    late_frame = frame("late", clock.now + 2)  # submitted first, due later
    early_frame = frame("early", clock.now + 1)
    scheduler.submit(late_frame, late)
    scheduler.submit(early_frame, early)
    clock.advance(0.01)  # both batching windows are over
    assert blocker.gate is not None
    blocker.gate.set()

    await settle([first, late_frame, early_frame])

    assert calls == ["busy", "early", "late"]


async def test_expired_frames_are_dropped_and_counted(harness: Harness) -> None:
    clock = FakeClock()
    scheduler = harness.scheduler(clock=clock)
    blocker = RecordingRunner("a", gate=harness.gate())
    runner = RecordingRunner("b")
    first = frame("a", clock.now + FAR)
    scheduler.submit(first, blocker)
    await wait_started(blocker)
    doomed = [frame("b", clock.now + 0.5, session=f"s{i}") for i in range(3)]
    survivor = frame("b", clock.now + 100)
    for request in [*doomed, survivor]:
        scheduler.submit(request, runner)
    clock.advance(1.0)  # the worker is still busy when the three deadlines pass
    stale = frame("b", clock.now - 0.1)
    scheduler.submit(stale, runner)  # already late: never queued
    assert scheduler.pending_for("b") == 4
    assert blocker.gate is not None
    blocker.gate.set()

    results = await settle([*doomed, survivor, stale])

    for result in results[:3]:
        assert isinstance(result, DeadlineExceededError)
        assert str(result) == "frame for model b missed its deadline by 500 ms; dropped"
    assert isinstance(results[3], np.ndarray)
    assert isinstance(results[4], DeadlineExceededError)
    assert "missed its deadline by 100 ms" in str(results[4])
    assert runner.batches == [[survivor]]
    stats = scheduler.stats()
    assert stats.expired == 4
    assert stats.models["b"].expired == 4
    assert stats.models["b"].frames == 1
    assert_stats_add_up(stats)


async def test_full_queue_rejects_at_once_and_accepted_frames_complete(harness: Harness) -> None:
    scheduler = harness.scheduler(queue_size=3)
    runner = RecordingRunner("m", gate=harness.gate())
    first = frame("m", time.monotonic() + FAR)
    scheduler.submit(first, runner)
    await wait_started(runner)  # running, so no longer waiting in the queue
    accepted = [frame("m", time.monotonic() + FAR) for _ in range(3)]
    for request in accepted:
        scheduler.submit(request, runner)
    refused = frame("m", time.monotonic() + FAR)

    with pytest.raises(QueueFullError) as info:
        scheduler.submit(refused, runner)

    assert str(info.value) == "device cpu:0 queue is full (3 frames waiting); try again later"
    assert not refused.future.done()  # refused by the exception, not through the future
    assert scheduler.queue_depth == 3
    assert scheduler.stats().rejected == 1
    assert runner.gate is not None
    runner.gate.set()
    results = await settle([first, *accepted])
    assert all(isinstance(r, np.ndarray) for r in results)
    stats = scheduler.stats()
    assert (stats.submitted, stats.completed, stats.rejected) == (4, 4, 1)


async def test_runner_errors_fail_their_batch_and_the_worker_keeps_serving(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = harness.scheduler()
    runner = RecordingRunner(
        "m", errors=[RuntimeError("boom"), ModelInputError("visual has the wrong shape"), []]
    )
    outcomes: list[np.ndarray | BaseException] = []
    with caplog.at_level(logging.ERROR, logger="inference_core.serving.scheduler"):
        for _ in range(4):  # one at a time: each call meets the next planned error
            request = frame("m", time.monotonic() + FAR)
            scheduler.submit(request, runner)
            outcomes += await settle([request])

    crashed, bad_input, too_few, fine = outcomes
    assert isinstance(crashed, InferenceError)
    assert str(crashed) == "inference failed on cpu:0 for model m: boom"
    assert isinstance(crashed.__cause__, RuntimeError)
    assert isinstance(bad_input, ModelInputError)  # inference errors pass through as they are
    assert isinstance(too_few, InferenceError)
    assert "returned 0 outputs for 1 frames" in str(too_few)
    assert isinstance(fine, np.ndarray)
    failures = [r for r in caplog.records if r.exc_info is not None]
    assert len(failures) == 3
    stats = scheduler.stats()
    assert (stats.failed, stats.completed, stats.batches) == (3, 1, 4)
    assert stats.models["m"].failed == 3
    assert_stats_add_up(stats)


async def test_stop_finishes_running_batches_and_fails_pending_frames(harness: Harness) -> None:
    scheduler = harness.scheduler(workers=2)
    gate = harness.gate()
    busy = [RecordingRunner(model, gate=gate) for model in ("a", "b")]
    running = [frame(r.model_id, time.monotonic() + FAR) for r in busy]
    for request, runner in zip(running, busy, strict=True):
        scheduler.submit(request, runner)
        await wait_started(runner)  # both workers are now inside run_batch
    waiting_runner = RecordingRunner("c")
    waiting = [frame("c", time.monotonic() + FAR) for _ in range(3)]
    for request in waiting:
        scheduler.submit(request, waiting_runner)

    stopping = asyncio.ensure_future(asyncio.to_thread(scheduler.stop, 10))
    pending_results = await settle(waiting)
    for result in pending_results:
        assert isinstance(result, ShuttingDownError)
        assert str(result) == "device cpu:0 is shutting down; frame not run"
    with pytest.raises(ShuttingDownError):
        scheduler.submit(frame("c", time.monotonic() + FAR), waiting_runner)
    gate.set()
    await asyncio.wait_for(stopping, 10)

    assert all(isinstance(r, np.ndarray) for r in await settle(running))
    assert waiting_runner.batches == []
    assert not scheduler_threads()
    scheduler.stop()  # a second stop is harmless
    stats = scheduler.stats()
    assert (stats.completed, stats.shut_down, stats.queue_depth, stats.in_flight) == (2, 3, 0, 0)
    assert_stats_add_up(stats)


async def test_drop_model_fails_its_pending_frames(harness: Harness) -> None:
    scheduler = harness.scheduler()
    blocker = RecordingRunner("a", gate=harness.gate())
    first = frame("a", time.monotonic() + FAR)
    scheduler.submit(first, blocker)
    await wait_started(blocker)
    runner = RecordingRunner("b")
    dropped = [frame("b", time.monotonic() + FAR) for _ in range(3)]
    for request in dropped:
        scheduler.submit(request, runner)

    assert scheduler.drop_model("b") == 3
    assert scheduler.drop_model("b") == 0

    results = await settle(dropped)
    assert all(isinstance(r, InferenceError) and "unloaded" in str(r) for r in results)
    assert scheduler.pending_for("b") == 0
    assert blocker.gate is not None
    blocker.gate.set()
    await settle([first])
    assert runner.batches == []
    assert scheduler.stats().dropped == 3


async def test_submit_refuses_a_runner_of_another_model(harness: Harness) -> None:
    scheduler = harness.scheduler()
    with pytest.raises(ValueError, match="submitted with the runner of 'other'"):
        scheduler.submit(frame("m", time.monotonic() + FAR), RecordingRunner("other"))


async def test_stats_add_up_while_running_and_after_stop(harness: Harness) -> None:
    clock = FakeClock()
    scheduler = harness.scheduler(queue_size=8, clock=clock)
    gate = harness.gate()
    blocker = RecordingRunner("a", gate=gate)
    ok = RecordingRunner("ok")
    bad = RecordingRunner("bad", errors=[RuntimeError("broken model")])
    first = frame("a", clock.now + FAR)
    scheduler.submit(first, blocker)
    await wait_started(blocker)
    submitted = [
        *(frame("ok", clock.now + 100, value=i) for i in range(4)),
        *(frame("bad", clock.now + 100) for _ in range(2)),
        *(frame("ok", clock.now + 0.5) for _ in range(2)),  # will expire
    ]
    runners = {"ok": ok, "bad": bad}
    for request in submitted:
        scheduler.submit(request, runners[request.model_id])
    with pytest.raises(QueueFullError):
        scheduler.submit(frame("ok", clock.now + 100), ok)
    late = frame("ok", clock.now - 1)
    scheduler.submit(late, ok)
    clock.advance(1.0)

    running = scheduler.stats()
    assert (running.in_flight, running.queue_depth) == (1, 8)
    assert_stats_add_up(running)

    gate.set()
    await settle([first, *submitted, late])
    # two more frames that are still queued when the scheduler stops
    gate.clear()
    blocker.started.clear()
    second = frame("a", clock.now + FAR)
    scheduler.submit(second, blocker)
    await wait_started(blocker)
    leftovers = [frame("ok", clock.now + FAR) for _ in range(2)]
    for request in leftovers:
        scheduler.submit(request, ok)
    stopping = asyncio.ensure_future(asyncio.to_thread(scheduler.stop, 10))
    await settle(leftovers)
    gate.set()
    await asyncio.wait_for(stopping, 10)

    stats = scheduler.stats()
    assert_stats_add_up(stats)
    assert (stats.submitted, stats.rejected) == (13, 1)
    assert (stats.completed, stats.failed, stats.expired, stats.shut_down) == (6, 2, 3, 2)
    assert stats.models["ok"].frames == 4
    assert stats.models["bad"].failed == 2
    assert stats.mean_batch_size == pytest.approx(8 / stats.batches)
    # the fake clock moved only once inside run_batch: 1 s during the first batch
    assert stats.busy_seconds == pytest.approx(1.0)


async def test_a_batch_that_ran_reports_each_frames_wait_in_the_queue(harness: Harness) -> None:
    """From its submit to its batch's start, on the scheduler's clock: the runner gets the
    batch's frames and their waits summed (Triton's ``queue``); a failed batch none."""
    clock = FakeClock()
    scheduler = harness.scheduler(max_batch_size=4, clock=clock)
    gate = harness.gate()
    blocker = RecordingRunner("a", gate=gate)
    waiting = RecordingRunner("b")
    broken = RecordingRunner("c", errors=[RuntimeError("broken model")])
    first = frame("a", clock.now + FAR)
    scheduler.submit(first, blocker)
    await wait_started(blocker)  # the worker is busy from here on
    early = frame("b", clock.now + FAR)
    scheduler.submit(early, waiting)
    clock.advance(2.0)
    late = [frame("b", clock.now + FAR) for _ in range(2)]
    doomed = frame("c", clock.now + FAR)
    for request in late:
        scheduler.submit(request, waiting)
    scheduler.submit(doomed, broken)
    clock.advance(0.5)
    gate.set()
    await settle([first, early, *late, doomed])
    assert blocker.queue_waits == [(1, 0.0)]  # taken as it came
    assert waiting.queue_waits == [(3, pytest.approx(2.5 + 0.5 + 0.5))]
    assert len(broken.batches) == 1
    assert broken.queue_waits == []


async def wait_for_workers(count: int) -> list[str]:
    """Wait until exactly ``count`` workers are alive (a replaced one may still be exiting)."""
    async with asyncio.timeout(10):
        while len(scheduler_threads()) != count:  # noqa: ASYNC110 - test polling
            await asyncio.sleep(0.01)
    return sorted(scheduler_threads())


async def test_a_worker_killed_by_its_runner_is_replaced(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = harness.scheduler(workers=2)
    runner = RecordingRunner("m", errors=[SystemExit(3)])
    with caplog.at_level(logging.ERROR, logger="inference_core.serving.scheduler"):
        killed = frame("m", time.monotonic() + FAR)
        scheduler.submit(killed, runner)
        (outcome,) = await settle([killed])

    assert isinstance(outcome, InferenceError)
    assert "died (SystemExit(3))" in str(outcome)
    assert "model m" in str(outcome)
    assert isinstance(outcome.__cause__, SystemExit)
    (died,) = [r for r in caplog.records if "died" in r.getMessage()]
    assert died.levelno == logging.ERROR
    assert died.exc_info is not None
    assert died.exc_info[0] is SystemExit  # the traceback is in the log

    assert await wait_for_workers(2) == [f"lipstream-{DEVICE}-w0", f"lipstream-{DEVICE}-w1"]
    later = [frame("m", time.monotonic() + FAR, value=i) for i in range(10)]
    for request in later:
        scheduler.submit(request, runner)
    results = await settle(later)
    assert [int(r[0]) for r in results if isinstance(r, np.ndarray)] == list(range(10))
    stats = scheduler.stats()
    assert stats.workers_restarted == 1
    assert (stats.failed, stats.completed, stats.in_flight) == (1, 10, 0)
    assert stats.models["m"].failed == 1
    assert_stats_add_up(stats)
    assert len(scheduler_threads()) == 2

    scheduler.stop(timeout=10)
    assert not scheduler_threads()  # the replacement is joined like the originals


class BrokenEvents:
    """A metrics hook with a bug: raises on its first call."""

    def __init__(self) -> None:
        self.calls = 0

    def batch_done(
        self, device: str, batch_size: int, queue_waits_s: Sequence[float], run_s: float
    ) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("bug in a hook")

    def model_loaded(self, device: str, seconds: float) -> None:
        pass

    def model_load_failed(self) -> None:
        pass


async def test_a_bug_in_the_worker_loop_costs_no_frame_and_no_worker(harness: Harness) -> None:
    scheduler = harness.scheduler(workers=1)
    scheduler.events = BrokenEvents()  # raises after the first batch delivered its results
    runner = RecordingRunner("m")
    first = frame("m", time.monotonic() + FAR, value=7)
    scheduler.submit(first, runner)
    (result,) = await settle([first])
    assert isinstance(result, np.ndarray)  # delivered before the hook broke the worker
    assert int(result[0]) == 7

    await wait_for_workers(1)
    later = [frame("m", time.monotonic() + FAR) for _ in range(3)]
    for request in later:
        scheduler.submit(request, runner)
    assert all(isinstance(r, np.ndarray) for r in await settle(later))
    stats = scheduler.stats()
    assert stats.workers_restarted == 1
    assert (stats.completed, stats.failed) == (4, 0)
    assert_stats_add_up(stats)


async def test_a_worker_that_keeps_dying_is_replaced_each_time(harness: Harness) -> None:
    scheduler = harness.scheduler(workers=1)
    runner = RecordingRunner("m", errors=[KeyboardInterrupt(), SystemExit(), SystemExit()])
    outcomes = []
    for _ in range(4):  # one at a time: each frame meets the next planned death
        request = frame("m", time.monotonic() + FAR)
        scheduler.submit(request, runner)
        outcomes += await settle([request])
    assert [type(o).__name__ for o in outcomes] == [
        "InferenceError",
        "InferenceError",
        "InferenceError",
        "ndarray",
    ]
    stats = scheduler.stats()
    assert (stats.workers_restarted, stats.failed, stats.completed) == (3, 3, 1)
    assert_stats_add_up(stats)
    assert await wait_for_workers(1) == [f"lipstream-{DEVICE}-w0"]


async def test_a_worker_dying_while_the_scheduler_stops_is_not_replaced(
    harness: Harness,
) -> None:
    scheduler = harness.scheduler(workers=1)
    gate = harness.gate()
    runner = RecordingRunner("m", gate=gate, errors=[SystemExit()])
    running = frame("m", time.monotonic() + FAR)
    scheduler.submit(running, runner)
    await wait_started(runner)
    stopping = asyncio.ensure_future(asyncio.to_thread(scheduler.stop, 10))
    queued: list[FrameRequest] = []
    async with asyncio.timeout(10):
        while True:  # stop() has begun once submit is refused
            queued.append(frame("m", time.monotonic() + FAR))
            try:
                scheduler.submit(queued[-1], runner)
            except ShuttingDownError:
                queued.pop()
                break
            await asyncio.sleep(0.01)
    gate.set()  # the runner now raises SystemExit with stop() already under way
    await asyncio.wait_for(stopping, 10)

    (result,) = await settle([running])
    assert isinstance(result, InferenceError)
    assert "not replaced" in str(result)
    assert all(isinstance(r, ShuttingDownError) for r in await settle(queued))
    stats = scheduler.stats()
    assert (stats.workers_restarted, stats.failed) == (0, 1)
    assert_stats_add_up(stats)
    assert not scheduler_threads()


class AdapterRunner:
    """A real model behind the runner seam: stacks the batch and runs the adapter once."""

    def __init__(self, model_id: str, adapter: LipSyncAdapter) -> None:
        self._model_id = model_id
        self.adapter = adapter
        self.batch_sizes: list[int] = []

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_batch_size(self) -> int:
        return self.adapter.max_batch_size

    def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        self.batch_sizes.append(len(requests))
        visual = np.stack([r.visual for r in requests])
        audio = np.stack([r.audio for r in requests])
        return list(self.adapter.run(visual, audio))

    def count_queue_wait(self, frames: int, seconds: float) -> None:
        pass  # only the batches are looked at here


async def test_real_onnx_model_serves_concurrent_sessions(harness: Harness, tmp_path: Path) -> None:
    adapter = LipSyncAdapter.from_path(
        tiny_lipsync(tmp_path / "tiny.onnx"), AdapterSpec(), max_batch_size=4
    )
    runner = AdapterRunner("tiny", adapter)
    scheduler = harness.scheduler(workers=2, max_batch_size=8, max_wait_ms=5)
    rng = np.random.default_rng(7)
    loop = asyncio.get_running_loop()

    def make(session: str) -> FrameRequest:
        return FrameRequest(
            model_id="tiny",
            visual=rng.integers(0, 256, (320, 320, 3), dtype=np.uint8),
            audio=rng.normal(0, 1, (32, 16, 16)).astype(np.float32),
            deadline=time.monotonic() + 60,
            future=loop.create_future(),
            loop=loop,
            session_id=session,
        )

    async def session(name: str) -> list[tuple[FrameRequest, np.ndarray]]:
        requests = []
        for _ in range(4):
            request = make(name)
            scheduler.submit(request, runner)
            requests.append(request)
            await asyncio.sleep(0)  # let the other sessions submit in between
        outputs = await asyncio.wait_for(asyncio.gather(*(r.future for r in requests)), 30)
        return list(zip(requests, outputs, strict=True))

    per_session = await asyncio.gather(*(session(f"s{i}") for i in range(3)))

    for pairs in per_session:
        for request, output in pairs:
            alone = adapter.run(request.visual[None], request.audio[None])[0]
            np.testing.assert_array_equal(output, alone)
    assert sum(runner.batch_sizes) == 12
    assert max(runner.batch_sizes) <= 4  # the adapter's limit, below the scheduler's 8
    stats = scheduler.stats()
    assert (stats.completed, stats.failed, stats.expired) == (12, 0, 0)
    assert_stats_add_up(stats)
