"""A lip-sync model open on a device: runs batches for the scheduler and counts its use.

:class:`LoadedModel` is the :class:`~inference_core.serving.frame_request.ModelRunner` the device
workers call. It is created (and closed) by the registry, which also moves its
reference count; workers call :meth:`LoadedModel.run_batch` concurrently from their
threads, so counters sit behind a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.package import AvatarPackage
from inference_core.exceptions import ModelInputError, ModelLoadError, ModelOutOfMemoryError
from inference_core.serving.devices import Device
from inference_core.serving.frame_request import FrameRequest

logger = logging.getLogger(__name__)

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
    ) -> None:
        self._model_id = model_id
        self.device = device
        self.package = package
        self._adapter: LipSyncAdapter | None = adapter
        self._spec = adapter.spec
        self._max_batch_size = adapter.max_batch_size
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
        session_factory: Callable[[Path, Device], ort.InferenceSession],
        *,
        max_batch_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> LoadedModel:
        """Open ``package``'s lip-sync model on ``device``, bind it and warm it up.

        Warms batch sizes 1 and ``max_batch_size`` (what the scheduler will send).
        Raises :class:`ModelOutOfMemoryError` when the device ran out of memory (also
        when onnxruntime's error text says so), else :class:`ModelLoadError`.
        """
        path = package.lipsync_path
        what = f"model {package.avatar_id!r} ({path.name}) on {device.name}"
        try:
            session = session_factory(path, device)
            adapter = LipSyncAdapter(
                session, package.manifest.adapter, max_batch_size=max_batch_size
            )
            model = cls(package.avatar_id, device, package, adapter, clock=clock)
            model.warm_up({1, model.max_batch_size})
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
        """Run ``requests`` as one batch (see :class:`ModelRunner`); thread-safe.

        uint8 visual inputs are scaled as the adapter scales them, float32 ones are taken
        as already scaled. Returns float32 ``[3,S,S]`` for raw requests, uint8 BGR
        ``[S,S,3]`` for the others.
        """
        if not requests:
            return []
        started = time.perf_counter()
        try:
            visual, audio = self._batch_inputs(requests)
            output = self._run_float(visual, audio)
            results = self._split_outputs(requests, output)
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

    def warm_up(self, batch_sizes: Iterable[int]) -> None:
        """Run zero inputs at each batch size so first real frames do not pay for set-up.

        Part of loading; errors propagate (an out-of-memory here is a failed load).
        """
        spec = self._spec
        for size in sorted(set(batch_sizes)):
            visual = np.zeros((size, *spec.visual_shape), dtype=np.float32)
            audio = np.zeros((size, *spec.audio_shape), dtype=np.float32)
            self._run_float(visual, audio)

    def close(self) -> None:
        """Drop the session: its memory goes back to the device only when it is destroyed."""
        self._adapter = None

    def _require_adapter(self) -> LipSyncAdapter:
        adapter = self._adapter
        if adapter is None:
            raise ModelLoadError(
                f"model {self._model_id!r} was unloaded from {self.device.name}; acquire it again"
            )
        return adapter

    def _batch_inputs(self, requests: Sequence[FrameRequest]) -> tuple[np.ndarray, np.ndarray]:
        spec = self._spec
        adapter = self._require_adapter()
        visual = np.empty((len(requests), *spec.visual_shape), dtype=np.float32)
        audio = np.empty((len(requests), *spec.audio_shape), dtype=np.float32)
        for i, request in enumerate(requests):
            v = request.visual
            if v.shape != spec.visual_shape or v.dtype not in (np.uint8, np.float32):
                raise ModelInputError(
                    f"model {self._model_id!r}: visual input must be uint8 or float32 "
                    f"{list(spec.visual_shape)}, got {v.dtype} {list(v.shape)}"
                )
            if v.dtype == np.uint8:
                adapter.scale_visual(v, out=visual[i])
            else:
                visual[i] = v
            if request.audio.shape != spec.audio_shape:
                raise ModelInputError(
                    f"model {self._model_id!r}: audio input must be {list(spec.audio_shape)}, "
                    f"got {list(request.audio.shape)}"
                )
            audio[i] = request.audio
        return visual, audio

    def _split_outputs(
        self, requests: Sequence[FrameRequest], output: np.ndarray
    ) -> list[np.ndarray]:
        faces = [i for i, r in enumerate(requests) if not r.raw]
        if len(faces) == len(requests):
            return list(self._require_adapter().to_uint8(output))
        bgr = self._require_adapter().to_uint8(output[faces]) if faces else None
        results: list[np.ndarray] = []
        face_index = 0
        for i, request in enumerate(requests):
            if request.raw:
                results.append(output[i].copy())  # a copy: a view would pin the whole batch
            else:
                assert bgr is not None
                results.append(bgr[face_index])
                face_index += 1
        return results

    def _run_float(self, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
        adapter = self._require_adapter()
        if self.device.kind != "cuda":
            return adapter.run_raw(visual, audio)
        return run_bound(adapter, visual, audio, device_type="cuda", device_id=self.device.ordinal)


def run_bound(
    adapter: LipSyncAdapter,
    visual: np.ndarray,
    audio: np.ndarray,
    *,
    device_type: str,
    device_id: int,
) -> np.ndarray:
    """Run float32 inputs through ``adapter``'s session with IOBinding; float32 ``[B,3,S,S]``.

    Inputs are bound from host memory (copied to the device once), the output is
    allocated on ``device_type``/``device_id`` by onnxruntime and copied back once,
    instead of ``run()``'s extra staging copies. Chunked to the adapter's batch size.
    """
    binding, session = adapter.binding, adapter.session
    step = adapter.max_batch_size
    chunks = []
    for start in range(0, visual.shape[0], step):
        io = session.io_binding()
        io.bind_cpu_input(binding.visual_name, np.ascontiguousarray(visual[start : start + step]))
        io.bind_cpu_input(binding.audio_name, np.ascontiguousarray(audio[start : start + step]))
        io.bind_output(binding.output_name, device_type, device_id)
        session.run_with_iobinding(io)
        chunks.append(np.asarray(io.copy_outputs_to_cpu()[0], dtype=np.float32))
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=0)
