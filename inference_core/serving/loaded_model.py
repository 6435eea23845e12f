"""A lip-sync model open on a device: runs batches for the scheduler and counts its use.

:class:`LoadedModel` is the :class:`~inference_core.serving.frame_request.ModelRunner` the device
workers call. It is created (and closed) by the registry, which also moves its
reference count; workers call :meth:`LoadedModel.run_batch` concurrently from their
threads, so counters sit behind a lock.

A batch runs through the model's serving graph with IOBinding: the frames' uint8
regions and audio are copied into the worker thread's preallocated (on CUDA
page-locked) buffers, the faces come back into one array per batch, and the binding
object is kept per worker buffer set and bucket (``docs/architecture.md`` §4).
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
from inference_core.adapter.serving_graph import (
    AUDIO,
    CROPS,
    FACES,
    RAW,
    SCALED,
    ServingGraph,
    load_serving_graph,
)
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelInputError, ModelLoadError, ModelOutOfMemoryError
from inference_core.serving.batch_buffers import (
    InputBuffers,
    bucket_for,
    bucket_sizes,
    thread_buffers,
)
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest

logger = logging.getLogger(__name__)

# Instances: an array's dtype compared with a scalar type converts the type every call.
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
        self._adapter: LipSyncAdapter | None = adapter
        self._spec = adapter.spec
        self._max_batch_size = adapter.max_batch_size
        self.buckets = bucket_sizes(adapter.max_batch_size)
        self.pad_batches = device.kind == "cuda" if pad_batches is None else pad_batches
        s = self._spec.input_size
        self._region_shape = (s, s, 3)
        self._no_scaled = np.zeros((0, *self._spec.visual_shape), dtype=np.float32)
        # (input buffer set, batch rows) -> the IOBinding made for it; each buffer set
        # belongs to one thread, so an entry is only ever used by one thread at a time.
        self._bindings: dict[tuple[int, int, int], ort.IOBinding] = {}
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
    def adapter(self) -> LipSyncAdapter | None:
        """The adapter and its session; None once closed."""
        return self._adapter

    @property
    def closed(self) -> bool:
        return self._adapter is None

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
        try:
            if len(requests) <= self._max_batch_size and not any(r.raw for r in requests):
                results: list[np.ndarray] = self._run_chunk(requests)  # a live batch: one run
            else:
                results = self._run_chunks(requests)
        except BaseException:
            with self._lock:
                self._failures += 1
            raise
        elapsed = time.perf_counter() - started
        with self._lock:
            self._frames += len(requests)
            self._batches += 1
            self._inference_seconds += elapsed
        return results

    def _run_chunks(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        """Runs of ``max_batch_size``, faces' frames first (the graph's batch order)."""
        results: list[np.ndarray | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].raw)
        step = self._max_batch_size
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            outputs = self._run_chunk([requests[i] for i in chunk])
            for i, output in zip(chunk, outputs, strict=True):
                results[i] = output
        return results  # type: ignore[return-value]  # every slot was filled

    def warm_up(self) -> None:
        """Run every bucket once (and a raw frame) so no shape is first seen live.

        Part of loading; errors propagate (an out-of-memory here is a failed load).
        """
        spec = self._spec
        region = np.zeros(self._region_shape, dtype=np.uint8)
        audio = np.zeros(spec.audio_shape, dtype=np.float32)
        frame = _WarmUpFrame(region, audio, raw=False)
        for size in self.buckets:
            self._run_chunk([frame] * size)  # type: ignore[list-item]
        raw = _WarmUpFrame(np.zeros(spec.visual_shape, dtype=np.float32), audio, raw=True)
        self._run_chunk([raw])  # type: ignore[list-item]

    def close(self) -> None:
        """Drop the session: its memory goes back to the device only when it is destroyed."""
        self._adapter = None
        self._bindings = {}

    def _require_adapter(self) -> LipSyncAdapter:
        adapter = self._adapter
        if adapter is None:
            raise ModelLoadError(
                f"model {self._model_id!r} was unloaded from {self.device.name}; acquire it again"
            )
        return adapter

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

    def _run_chunk(self, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
        """One model run: faces' frames first, raw frames last, padded if configured."""
        adapter = self._require_adapter()
        spec = self._spec
        raw_count = sum(1 for r in requests if r.raw)
        live = len(requests) - raw_count
        rows = bucket_for(len(requests), self.buckets) if self.pad_batches else len(requests)
        crop_rows = rows - raw_count  # padding sits after the faces' frames
        local = thread_buffers()
        buffers = local.get(
            spec.input_size, spec.audio_shape, self.buckets[-1], pinned=self.device.kind == "cuda"
        )
        crops, audio = buffers.crops, buffers.audio
        for j in range(live):
            request = requests[j]
            crops[j] = request.visual
            audio[j] = request.audio
        for k in range(raw_count):
            audio[crop_rows + k] = requests[live + k].audio
        if raw_count:
            return self._run_mixed(adapter, requests, live, buffers, rows)
        slab = local.faces(spec.input_size, self.buckets[-1], pinned=buffers.pinned)
        faces = slab.faces[:rows]
        key = (buffers.serial, rows, slab.serial)
        io = self._bindings.get(key) if slab.pooled else None
        on_host = self.device.kind == "cpu"
        if io is None:
            # The buffers and a kept slab stay where they are: bound once, used every run
            # (a one-off slab's binding goes with it, so the table stays bounded).
            io = adapter.session.io_binding()
            if slab.pooled:
                self._bindings[key] = io
            io.bind_cpu_input(SCALED, self._no_scaled)
            io.bind_output(FACES, "cpu", 0, np.uint8, list(faces.shape), faces.ctypes.data)
            if on_host:
                io.bind_cpu_input(CROPS, crops[:rows])
                io.bind_cpu_input(AUDIO, audio[:rows])
        if not on_host:  # on a GPU binding an input is its copy to the device: every run
            io.bind_cpu_input(CROPS, crops[:rows])
            io.bind_cpu_input(AUDIO, audio[:rows])
        adapter.session.run_with_iobinding(io)
        return list(faces[:live])

    def _run_mixed(
        self,
        adapter: LipSyncAdapter,
        requests: Sequence[FrameRequest],
        live: int,
        buffers: InputBuffers,
        rows: int,
    ) -> list[np.ndarray]:
        """A run with raw API frames (those after the first ``live``): their scaled inputs
        and float outputs are this run's own arrays, bound for this run only."""
        spec = self._spec
        raws = requests[live:]
        crop_rows = rows - len(raws)  # padding sits after the faces' frames
        s = spec.input_size
        io = adapter.session.io_binding()
        io.bind_cpu_input(CROPS, buffers.crops[:crop_rows])
        io.bind_cpu_input(SCALED, np.stack([r.visual for r in raws]))
        io.bind_cpu_input(AUDIO, buffers.audio[:rows])
        faces = np.empty((rows, s, s, 3), dtype=np.uint8)
        raw = np.empty((rows, *spec.output_shape), dtype=np.float32)
        io.bind_output(FACES, "cpu", 0, np.uint8, list(faces.shape), faces.ctypes.data)
        io.bind_output(RAW, "cpu", 0, np.float32, list(raw.shape), raw.ctypes.data)
        adapter.session.run_with_iobinding(io)
        return [*faces[:live], *raw[crop_rows:]]


@dataclass(frozen=True)
class _WarmUpFrame:
    """The fields of a :class:`FrameRequest` that a model run reads."""

    visual: np.ndarray
    audio: np.ndarray
    raw: bool
