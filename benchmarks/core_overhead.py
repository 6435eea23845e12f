"""The inference core's own cost per frame, apart from any model's work.

    .venv/bin/python -m benchmarks.run --only core_overhead [--quick]
    .venv/bin/python -m benchmarks.core_overhead [--rounds 5] [--frames 4000] [--json out.json]
    .venv/bin/python -m benchmarks.ab --baseline COMMIT --only core_overhead   # before/after

A model served through the core costs its own run plus what the core does around it. The
second part is measured directly, not as the difference of two noisy rates: the model
(:func:`build_identity_model`, the unet_328 I/O whose output is the reference half of
its input) runs with one intra-op thread, so its CPU time is the worker thread's CPU
time inside onnxruntime's ``run_with_iobinding`` (:class:`ModelClock`), and the core's
cost is the process's CPU time (all threads) minus that, per frame, over thousands of
frames. Three figures, at 1, 8 and 32 sessions each keeping two frames in flight:

1. **Scheduler alone**: frames submitted as a session does (a
   :class:`~inference_core.serving.frame_request.FrameRequest`, its deadline and session)
   to a :class:`~inference_core.serving.scheduler.DeviceScheduler` whose runner does no
   work (:class:`NullRunner`): queueing, batching, the worker hand-off, completion and
   each session's wake-up. Then the same beside a runner that streams
   :data:`TRAFFIC_MB` MB through memory per batch and nothing else (its own CPU time not
   counted): on a CPU device the model's activations evict the core's code and data
   from the caches between batches, so the same Python costs more there than beside a
   model that runs on a GPU.
2. **Whole core**: the identity model through registry → device scheduler → worker →
   batch → split, outside the model's run: the above plus gathering the frames into the
   batch buffers, binding, handing out the outputs. Beside it the frames/s of the served
   model against its raw ``session.run`` at the batch the core formed (inputs ready in
   one array, as the raw baseline has them).
3. **run_batch alone**: ``LoadedModel.run_batch`` at batch 1 and 8 outside the model's run.

Each figure is the median of ``--rounds`` rounds (served and raw alternate). Before/after
figures come from ``benchmarks.ab`` (this module is brought into the baseline's tree, so
both trees are measured with the same instrument). Target: the whole core at most 10 µs
per frame. The submitting coroutine's own awaits are in figures 1 and 2, as a live
session's are in its frames. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_inference_collection import Session as OrtSession

from benchmarks.common import Result, Target, print_table, print_targets
from benchmarks.core_throughput import RawRunner
from config.settings import Settings
from inference_core.adapter.spec import AdapterSpec
from inference_core.assets.demo_avatar import write_demo_avatar
from inference_core.avatars.locator import AvatarLocator
from inference_core.serving.core import InferenceCore
from inference_core.serving.frame_request import FrameRequest
from inference_core.serving.handle import ModelHandle
from inference_core.serving.scheduler import DeviceScheduler
from inference_core.serving.scheduler_stats import SchedulerStats

SESSION_COUNTS = (1, 8, 32)
IN_FLIGHT = 2  # frames each session keeps queued, as a live session does
BATCH = 8
TARGET_US = 10.0
#: Memory a batch of the identity model streams through on the CPU, about: its serving
#: graph's activations at batch 8 (the uint8 regions as float32 planes, six channels).
TRAFFIC_MB = 8
RAW_SECONDS = 1.5  # each raw segment
SIZE = AdapterSpec().input_size
AUDIO_SHAPE = AdapterSpec().audio_shape


def build_identity_model(path: Path) -> Path:
    """An ONNX model with the unet_328 I/O whose output is its input's first three
    channels (the reference half): as near to no work as the interface allows."""
    constants = [
        helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [1], [v])
        )
        for name, v in (("starts", 0), ("ends", 3), ("axes", 1))
    ]
    slice_ = helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["output"])
    graph = helper.make_graph(
        [*constants, slice_],
        "identity",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 6, SIZE, SIZE]),
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", *AUDIO_SHAPE]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def cpu_us() -> float:
    """This process's CPU time (all threads), in µs."""
    return time.process_time() * 1e6


class NullRunner:
    """A model that does no work: each frame's output is a view of one array.

    With ``traffic_mb`` each batch streams that many MB through memory first (half read,
    half written; numpy lets go of the GIL), as a model on the CPU does with its
    activations; the CPU time of that is kept in ``traffic_us``, apart from the core's.
    """

    model_id = "null"
    max_batch_size = BATCH

    def __init__(self, traffic_mb: int = 0) -> None:
        self._faces = np.zeros((BATCH, SIZE, SIZE, 3), dtype=np.uint8)
        half = traffic_mb * 2**20 // 8
        self._source = np.ones(half, dtype=np.float32)
        self._target = np.empty_like(self._source)
        self.traffic_us = 0.0

    def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        if self._source.size:
            start = time.thread_time()
            np.multiply(self._source, 1.5, out=self._target)
            self.traffic_us += (time.thread_time() - start) * 1e6
        return list(self._faces[: len(requests)])

    def count_queue_wait(self, frames: int, seconds: float) -> None:
        pass  # the benchmark measures the core's own cost, not what frames waited


def _frame() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    visual = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    return visual, rng.normal(0, 1, AUDIO_SHAPE).astype(np.float32)


async def _sessions(submit_one: object, sessions: int, frames: int) -> int:
    """Run ``sessions`` sessions of ``frames // sessions`` frames each, each keeping
    :data:`IN_FLIGHT` frames queued and awaiting them oldest first; frames completed."""
    per_session = max(1, frames // sessions)
    done = 0

    async def session(index: int) -> None:
        nonlocal done
        pending: collections.deque[asyncio.Future[np.ndarray]] = collections.deque()
        sent = 0
        while pending or sent < per_session:
            while len(pending) < IN_FLIGHT and sent < per_session:
                pending.append(submit_one(index))  # type: ignore[operator]
                sent += 1
            await pending.popleft()
            done += 1

    await asyncio.gather(*(session(i) for i in range(sessions)))
    return done


async def scheduler_cost(sessions: int, frames: int, rounds: int, *, traffic_mb: int = 0) -> float:
    """CPU µs per frame of the scheduler path with :class:`NullRunner` (median round),
    its memory traffic (``traffic_mb`` per batch) not counted."""
    scheduler = DeviceScheduler(
        "overhead", workers=1, queue_size=4096, max_batch_size=BATCH, max_wait_ms=5
    )
    scheduler.start()
    runner, (visual, audio) = NullRunner(traffic_mb), _frame()
    loop = asyncio.get_running_loop()

    def submit_one(index: int) -> asyncio.Future[np.ndarray]:
        request = FrameRequest(
            model_id="null",
            visual=visual,
            audio=audio,
            deadline=time.monotonic() + 60,
            future=loop.create_future(),
            loop=loop,
            session_id=f"s{index}",
        )
        scheduler.submit(request, runner)
        return request.future

    try:
        await _sessions(submit_one, sessions, frames // 4)  # warm
        costs = []
        for _ in range(rounds):
            start, traffic = cpu_us(), runner.traffic_us
            done = await _sessions(submit_one, sessions, frames)
            costs.append((cpu_us() - start - (runner.traffic_us - traffic)) / done)
    finally:
        await loop.run_in_executor(None, scheduler.stop)
    return statistics.median(costs)


class ModelClock:
    """CPU time spent inside the model's own runs (onnxruntime's ``run_with_iobinding``,
    which ``LoadedModel`` calls), in µs: with one intra-op thread a run's work is all on
    the thread that called it, so that thread's CPU time across the call is the model's."""

    def __init__(self) -> None:
        self.us = 0.0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self) -> Iterator[ModelClock]:
        original = OrtSession.run_with_iobinding

        def timed(session: OrtSession, iobinding: Any, run_options: Any = None) -> Any:
            start = time.thread_time()
            try:
                return original(session, iobinding, run_options)
            finally:
                spent = (time.thread_time() - start) * 1e6
                with self._lock:
                    self.us += spent

        OrtSession.run_with_iobinding = timed
        try:
            yield self
        finally:
            OrtSession.run_with_iobinding = original


def wrapper_cost(core: InferenceCore, clock: ModelClock, batch: int, frames: int) -> float:
    """CPU µs per frame that ``LoadedModel.run_batch`` spends outside the model's run."""
    model = core.registry.entry("bench").model
    assert model is not None, "the identity model is loaded while the benchmark runs"
    visual, audio = _frame()
    loop = asyncio.new_event_loop()
    try:
        requests = [
            FrameRequest("bench", visual, audio, 0.0, loop.create_future(), loop)
            for _ in range(batch)
        ]
        model.run_batch(requests)
        runs = max(1, frames // batch)
        start, inside = time.thread_time() * 1e6, clock.us
        for _ in range(runs):
            model.run_batch(requests)
        spent = time.thread_time() * 1e6 - start - (clock.us - inside)
    finally:
        loop.close()
    return spent / (runs * batch)


async def served_cost(
    handles: list[ModelHandle], clock: ModelClock, frames: int
) -> tuple[float, float, int]:
    """(CPU µs per frame outside the model's runs, frames/s, frames) of the sessions
    served through the core."""
    visual, audio = _frame()

    def submit_one(index: int) -> asyncio.Future[np.ndarray]:
        deadline = time.monotonic() + 60
        return handles[index].submit(visual, audio, deadline=deadline, session_id=f"s{index}")

    start, inside, wall = cpu_us(), clock.us, time.perf_counter()
    done = await _sessions(submit_one, len(handles), frames)
    elapsed = time.perf_counter() - wall
    return (cpu_us() - start - (clock.us - inside)) / done, done / elapsed, done


async def _raw_fps(raw: RawRunner, batch: int) -> float:
    """Frames/s of back-to-back ``session.run`` at ``batch`` (inputs ready in one array)."""
    frames, seconds = await asyncio.get_running_loop().run_in_executor(
        None, raw.frames_in, batch, RAW_SECONDS
    )
    return frames / seconds


def _mean_batch(core: InferenceCore, before: SchedulerStats, frames: int) -> float:
    """Frames per batch the core ran since ``before`` (``frames`` of them)."""
    batches = core.schedulers[0].stats().batches - before.batches
    return max(1.0, frames / batches) if batches else 1.0


async def measure(root: Path, *, rounds: int, frames: int) -> Result:
    model = build_identity_model(write_demo_avatar(root / "bench", count=2) / "lipsync.onnx")
    settings = Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            # One intra-op thread: the model's CPU time is all on the worker (ModelClock).
            "devices": {"count": 1, "workers_per_device": 1, "cpu_threads_per_session": 1},
            "batching": {"max_batch_size": BATCH, "max_wait_ms": 5, "queue_size": 4096},
        }
    )
    raw = RawRunner(model, settings)
    core = InferenceCore(settings, AvatarLocator(root))
    await core.start()
    loop = asyncio.get_running_loop()
    rows: dict[int, Result] = {}
    try:
        with ModelClock().installed() as clock:
            async with await core.open("bench"):  # loaded and held
                wrapper = {
                    b: statistics.median(
                        [
                            await loop.run_in_executor(
                                None, wrapper_cost, core, clock, b, frames // 4
                            )
                            for _ in range(rounds)
                        ]
                    )
                    for b in (1, BATCH)
                }
            for count in SESSION_COUNTS:
                rows[count] = await _at(core, raw, clock, count, rounds=rounds, frames=frames)
    finally:
        await core.stop()
    return {"sessions": rows, "wrapper_us": wrapper}


async def _at(
    core: InferenceCore, raw: RawRunner, clock: ModelClock, count: int, *, rounds: int, frames: int
) -> Result:
    """The scheduler alone, then served and raw in alternating rounds, at ``count`` sessions."""
    scheduler_us = await scheduler_cost(count, frames, rounds)
    cold_us = await scheduler_cost(count, frames, rounds, traffic_mb=TRAFFIC_MB)
    handles = [await core.open("bench") for _ in range(count)]
    before = core.schedulers[0].stats()
    _, _, done = await served_cost(handles, clock, frames // 8)  # warm; the batch it forms
    formed = _mean_batch(core, before, done)
    costs, ratios, batches = [], [], []
    for i in range(rounds):
        if i % 2:  # alternate which side goes first
            raw_fps = await _raw_fps(raw, round(formed))
        before = core.schedulers[0].stats()
        served_us, served_fps, done = await served_cost(handles, clock, frames // 4)
        formed = _mean_batch(core, before, done)
        if not i % 2:
            raw_fps = await _raw_fps(raw, round(formed))
        costs.append(served_us)
        ratios.append(served_fps / raw_fps)
        batches.append(formed)
    for handle in handles:
        handle.close()
    return {
        "scheduler_us": scheduler_us,
        "scheduler_cold_us": cold_us,
        "core_us": statistics.median(costs),
        "core_us_rounds": costs,
        "served_over_raw": statistics.median(ratios),
        "mean_batch": statistics.median(batches),
    }


def run(quick: bool = False, *, rounds: int | None = None, frames: int | None = None) -> Result:
    """Measure, print the table, return JSON-able results."""
    rounds = rounds or (3 if quick else 5)
    frames = frames or (2000 if quick else 4000)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(Path(tmp), rounds=rounds, frames=frames))
    sessions = result["sessions"]
    rows = [
        [
            count,
            r["scheduler_us"],
            r["scheduler_cold_us"],
            r["mean_batch"],
            f"**{r['core_us']:.1f}**",
            f"{min(r['core_us_rounds']):.1f}–{max(r['core_us_rounds']):.1f}",
            r["served_over_raw"],
        ]
        for count, r in sessions.items()
    ]
    print_table(
        f"Inference core overhead, identity model (CPU µs per frame, {rounds} rounds, "
        f"{frames} frames per scheduler round)",
        [
            "sessions",
            "scheduler alone (no model)",
            f"scheduler beside {TRAFFIC_MB} MB of traffic a batch",
            "batch formed",
            "whole core (outside the model's run)",
            "rounds min–max",
            "served/raw frames/s",
        ],
        rows,
    )
    wrapper = result["wrapper_us"]
    print(
        "  LoadedModel.run_batch outside the model's run: "
        + ", ".join(f"batch {b}: {us:.1f} µs/frame" for b, us in wrapper.items())
    )
    targets = [
        Target(f"core cost per frame at {count} sessions (µs)", r["core_us"], TARGET_US, False)
        for count, r in sessions.items()
    ]
    print_targets(targets)
    return {**result, "rounds": rounds, "frames": frames, "targets": [t.as_json() for t in targets]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(rounds=args.rounds, frames=args.frames)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
