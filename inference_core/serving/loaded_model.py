"""A lip-sync model open on a device: runs batches for the scheduler and counts its use.

:class:`LoadedModel` is the :class:`~inference_core.serving.frame_request.ModelRunner` the device
workers call. It is created (and closed) by the registry, which also moves its
reference count; workers call :meth:`LoadedModel.run_batch` concurrently from their
threads, so counters sit behind a lock.

A batch runs through the model's serving graph with IOBinding
(:class:`~inference_core.serving.batch_runs.BatchRuns`); this module splits it into runs
the model takes and counts what they did and took, in Triton's terms: frames and batches,
the time the frames waited in the device's queue (the scheduler reports it) and the time
of their runs' parts (``docs/design/serving.md`` §4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.serving_graph import ServingGraph, load_serving_graph
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelInputError, ModelLoadError, ModelOutOfMemoryError
from inference_core.serving.batch_runs import BatchRuns, RunTimes
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest

logger = logging.getLogger(__name__)

# dtype instances, not the scalar types: comparing an array's dtype with a type converts
# the type on every call, and every frame submitted is checked.
_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)

#: Texts onnxruntime (and CUDA under it) use when a device runs out of memory.
OUT_OF_MEMORY_MARKERS = ("out of memory", "failed to allocate", "cuda failure 2")


def is_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` (or its cause) reads like a device out-of-memory failure."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ModelOutOfMemoryError):
            return True
        text = str(seen).lower()
        if any(marker in text for marker in OUT_OF_MEMORY_MARKERS):
            return True
        seen = seen.__cause__
    return False


@dataclass(frozen=True)
class UsageStats:
    """A consistent snapshot of one loaded model's counters."""

    refcount: int
    usage_count: int
    frames: int
    batches: int
    failures: int
    inference_seconds: float
    last_used: float  # monotonic clock (the registry's)
    last_used_wall: float  # time.time()
    # Triton's durations, in ns, each frame of a batch counted with the batch's time:
    queue_frames: int  # frames of batches that ran whose queue wait was reported
    queue_ns: int  # the time those waited in the device's queue
    input_ns: int  # the parts of the runs of ``frames``: inputs copied in and bound,
    infer_ns: int  # the model run
    output_ns: int  # and the outputs handed back

    @property
    def mean_ms_per_frame(self) -> float:
        return self.inference_seconds * 1000 / self.frames if self.frames else 0.0


class LoadedModel:
    """One open lip-sync session on one device, with its use counters.

    ``memory_bytes`` is what loading and warming it up measured on its device.
    ``pad_batches`` (default: on CUDA only) runs every batch at its bucket's size.
    """

    def __init__(
        self,
        model_id: str,
        device: Device,
        package: AvatarPackage,
        adapter: LipSyncAdapter,
        *,
        clock: Callable[[], float] = time.monotonic,
        memory_bytes: int = 0,
        load_seconds: float = 0.0,
        pad_batches: bool | None = None,
    ) -> None:
        self._model_id = model_id
        self.device = device
        self.package = package
        self._spec = adapter.spec
        self._max_batch_size = adapter.max_batch_size
        pad = device.kind == "cuda" if pad_batches is None else pad_batches
        self.runs = BatchRuns(model_id, adapter, device, pad_batches=pad)
        self._region_shape = self.runs.region_shape
        self._clock = clock
        self.memory_bytes = memory_bytes
        self.load_seconds = load_seconds
        self.loaded_at = time.time()
        self._lock = threading.Lock()
        self._refcount = 0
        self._usage_count = 0
        self._frames = 0
        self._batches = 0
        self._failures = 0
        self._inference_seconds = 0.0
        self._times = RunTimes()
        self._queue_frames = 0
        self._queue_ns = 0
        self._last_used = clock()
        self._last_used_wall = self.loaded_at

    @classmethod
    def open(
        cls,
        package: AvatarPackage,
        device: Device,
        session_factory: Callable[[ServingGraph, Device], ort.InferenceSession],
        *,
        max_batch_size: int,
        clock: Callable[[], float] = time.monotonic,
        fp16: bool = False,
        pad_batches: bool | None = None,
    ) -> LoadedModel:
        """Wrap ``package``'s lip-sync model, open it on ``device`` and warm every bucket.

        ``fp16`` converts the weights to float16 (CUDA devices only; a CPU device keeps
        float32). Raises :class:`ModelOutOfMemoryError` when the device ran out of
        memory (also when onnxruntime's error text says so), else :class:`ModelLoadError`.
        """
        path = package.lipsync_path
        spec = package.manifest.adapter
        what = f"model {package.avatar_id!r} ({path.name}) on {device.name}"
        try:
            on_cpu = device.kind == "cpu"
            graph = load_serving_graph(path, spec, fp16=fp16 and not on_cpu, raw_branch=on_cpu)
            session = session_factory(graph, device)
            adapter = LipSyncAdapter(session, spec, graph.binding, max_batch_size=max_batch_size)
            model = cls(
                package.avatar_id, device, package, adapter, clock=clock, pad_batches=pad_batches
            )
            model.warm_up()
        except Exception as exc:  # onnxruntime raises bare RuntimeError/Fail subclasses
            if is_out_of_memory(exc):
                raise ModelOutOfMemoryError(
                    f"{what} ran out of device memory while loading: {exc}; free memory, lower "
                    "batching.max_batch_size or devices.max_models_per_device, or add devices"
                ) from exc
            if isinstance(exc, ModelLoadError):
                raise ModelLoadError(f"{what}: {exc}") from exc
            raise ModelLoadError(f"{what} failed to load or warm up: {exc}") from exc
        return model

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_batch_size(self) -> int:
        """Frames per model run: the configured batch size, 1 for a static-batch model."""
        return self._max_batch_size

    @property
    def spec(self) -> AdapterSpec:
        return self._spec

    @property
    def buckets(self) -> tuple[int, ...]:
        """The batch sizes it runs at (each warmed at load)."""
        return self.runs.buckets

    @property
    def pad_batches(self) -> bool:
        return self.runs.pad_batches

    @property
    def adapter(self) -> LipSyncAdapter | None:
        """The adapter and its session; None once closed."""
        return self.runs.adapter

    @property
    def closed(self) -> bool:
        return self.runs.adapter is None

    @property
    def refcount(self) -> int:
        return self._refcount

    @property
    def last_used(self) -> float:
        """When it was last acquired or released (or loaded), on the registry's clock."""
        return self._last_used

    def stats(self) -> UsageStats:
        """A snapshot of the counters, taken under the lock."""
        with self._lock:
            return UsageStats(
                refcount=self._refcount,
                usage_count=self._usage_count,
                frames=self._frames,
                batches=self._batches,
                failures=self._failures,
                inference_seconds=self._inference_seconds,
                last_used=self._last_used,
                last_used_wall=self._last_used_wall,
                queue_frames=self._queue_frames,
                queue_ns=self._queue_ns,
                input_ns=self._times.input_ns,
                infer_ns=self._times.infer_ns,
                output_ns=self._times.output_ns,
            )

    def mark_acquired(self) -> None:
        """Count one more holder (the registry calls this from ``acquire``)."""
        with self._lock:
            self._refcount += 1
            self._usage_count += 1
            self._touch()

    def mark_released(self) -> None:
        """Count one holder fewer (the registry calls this from ``release``)."""
        with self._lock:
            if self._refcount == 0:
                raise ValueError(f"model {self._model_id!r} released more often than acquired")
            self._refcount -= 1
            self._touch()

    def _touch(self) -> None:
        self._last_used = self._clock()
        self._last_used_wall = time.time()

    def run_batch(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        """Run ``requests`` (see :class:`ModelRunner`); thread-safe.

        A request with uint8 ``[S,S,3]`` visual input gets a uint8 BGR face ``[S,S,3]``;
        a raw one (float32 ``[6,S,S]``, already scaled) the float32 ``[3,S,S]`` output
        (shapes as :meth:`check_frame` accepts them: the handle checked each frame).
        More requests than ``max_batch_size`` run as several batches.
        """
        if not requests:
            return []
        started = time.perf_counter()
        times = RunTimes()
        try:
            if len(requests) <= self._max_batch_size and not any(r.raw for r in requests):
                results: list[np.ndarray] = self.runs.run(requests, times)  # a live batch
            else:
                results = self._run_chunks(requests, times)
        except BaseException:
            with self._lock:
                self._failures += 1
            raise
        elapsed = time.perf_counter() - started
        with self._lock:
            self._frames += len(requests)
            self._batches += 1
            self._inference_seconds += elapsed
            self._times.input_ns += times.input_ns
            self._times.infer_ns += times.infer_ns
            self._times.output_ns += times.output_ns
        return results

    def count_queue_wait(self, frames: int, seconds: float) -> None:
        """Add a batch that ran: its ``frames`` frames waited ``seconds`` in all in the
        device's queue (the scheduler calls this before their results are delivered)."""
        with self._lock:
            self._queue_frames += frames
            self._queue_ns += round(seconds * 1e9)

    def _run_chunks(self, requests: Sequence[FrameRequest], times: RunTimes) -> list[np.ndarray]:
        """Requests in runs of ``max_batch_size``, faces' frames first, raw ones after
        (the serving graph's batch order); outputs in the requests' order."""
        results: list[np.ndarray | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].raw)
        step = self._max_batch_size
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            outputs = self.runs.run([requests[i] for i in chunk], times)
            for i, output in zip(chunk, outputs, strict=True):
                results[i] = output
        return results  # type: ignore[return-value]  # every slot was filled

    def warm_up(self) -> None:
        """Run every bucket once (and a raw frame) so no shape is first seen live.

        Part of loading; errors propagate (an out-of-memory here is a failed load). Its
        runs are not counted.
        """
        self.runs.warm_up()

    def close(self) -> None:
        """Drop the session: its memory goes back to the device only when it is destroyed."""
        self.runs.close()

    def check_frame(self, visual: np.ndarray, audio: np.ndarray, *, raw: bool) -> None:
        """Raise :class:`ModelInputError` unless one frame fits this model: a uint8
        ``[S,S,3]`` region (float32 ``[6,S,S]`` if ``raw``) and an audio window of the
        spec's shape. Checked once per frame when it is submitted, so that a malformed
        frame is refused to its sender alone, not failed with the batch it would join."""
        spec = self._spec
        dtype, shape = (_FLOAT32, spec.visual_shape) if raw else (_UINT8, self._region_shape)
        if visual.dtype != dtype or visual.shape != shape:
            kind = "raw visual input" if raw else "visual input (the model region)"
            raise ModelInputError(
                f"model {self._model_id!r}: {kind} must be {np.dtype(dtype).name} "
                f"{list(shape)}, got {visual.dtype} {list(visual.shape)}"
            )
        if audio.shape != spec.audio_shape:
            raise ModelInputError(
                f"model {self._model_id!r}: audio input must be {list(spec.audio_shape)}, "
                f"got {list(audio.shape)}"
            )
