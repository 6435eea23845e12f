"""Everything operators see of the inference core, as one immutable, serialisable value.

:meth:`InferenceCore.snapshot() <inference_core.serving.core.InferenceCore.snapshot>`
returns a :class:`CoreSnapshot`: per device its model memory, limits, measured memory
and scheduler counters (:class:`~inference_core.serving.scheduler_stats.SchedulerStats`),
per registered model its state and usage, and the evictions so far. The admin API,
``/metrics`` and ``/ready`` read nothing else (``docs/design/failure.md`` §13), and a
snapshot crosses a process boundary as JSON (:meth:`CoreSnapshot.to_json`,
:meth:`CoreSnapshot.from_json`) unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import TypeAdapter

from inference_core.serving.loaded_model import LoadedModel
from inference_core.serving.scheduler_stats import SchedulerStats

ModelState = Literal["registered", "loading", "loaded", "failed"]
EvictionReason = Literal["capacity", "idle", "admin"]


@dataclass(frozen=True)
class ModelSnapshot:
    """One registered model. Times are wall clock (``time.time()``), None when not loaded."""

    model_id: str
    state: ModelState
    device: str | None
    memory_bytes: int  # measured around its load and warm-up
    refcount: int  # sessions holding it now
    usage_count: int  # times it was acquired since it loaded
    frames: int
    batches: int
    failures: int  # frames whose batch raised
    inference_ms_total: float
    mean_ms_per_frame: float
    # Triton's per-request durations, each frame counted with its batch's time (ns):
    # the queue wait of ``queue_frames`` frames, and the parts of the ``frames`` frames' runs.
    queue_frames: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    last_used: float | None
    loaded_at: float | None
    load_seconds: float | None
    last_error: str | None


@dataclass(frozen=True)
class DeviceSnapshot:
    """One device: the models on it, its limits, its memory and its scheduler."""

    index: int
    name: str
    kind: str
    models_loaded: int
    models_loading: int  # loads placed here, not finished
    model_memory_bytes: int  # measured memory of the models loaded here
    max_memory_bytes: int | None  # devices.max_memory_per_device
    max_models: int  # devices.max_models_per_device
    memory_used_bytes: int  # the whole GPU (NVML) for cuda, this process's RSS for cpu
    memory_total_bytes: int | None  # capped by devices.max_memory_per_device; None if unknown
    scheduler: SchedulerStats

    @property
    def workers_alive(self) -> int:
        """Worker threads running now (0 means the device cannot serve)."""
        return sum(1 for worker in self.scheduler.workers if worker.alive)


@dataclass(frozen=True)
class CoreSnapshot:
    """The inference core at one moment."""

    running: bool  # started and not stopping
    devices: tuple[DeviceSnapshot, ...]
    models: tuple[ModelSnapshot, ...]  # sorted by id
    evictions: dict[EvictionReason, int]

    def model(self, model_id: str) -> ModelSnapshot | None:
        """The snapshot of ``model_id``, or None when it is not registered."""
        return next((m for m in self.models if m.model_id == model_id), None)

    def to_json(self) -> bytes:
        """The snapshot as JSON (what crosses a process boundary)."""
        return _CORE_JSON.dump_json(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> CoreSnapshot:
        """The snapshot :meth:`to_json` wrote."""
        return _CORE_JSON.validate_json(data)


_CORE_JSON = TypeAdapter(CoreSnapshot)


def model_snapshot(
    model_id: str, state: ModelState, model: LoadedModel | None, last_error: str | None
) -> ModelSnapshot:
    """The snapshot of one registered model, loaded (``model``) or not."""
    if model is None:
        return ModelSnapshot(
            model_id=model_id,
            state=state,
            device=None,
            memory_bytes=0,
            refcount=0,
            usage_count=0,
            frames=0,
            batches=0,
            failures=0,
            inference_ms_total=0.0,
            mean_ms_per_frame=0.0,
            queue_frames=0,
            queue_ns=0,
            compute_input_ns=0,
            compute_infer_ns=0,
            compute_output_ns=0,
            last_used=None,
            loaded_at=None,
            load_seconds=None,
            last_error=last_error,
        )
    s = model.stats()
    return ModelSnapshot(
        model_id=model_id,
        state=state,
        device=model.device.name,
        memory_bytes=model.memory_bytes,
        refcount=s.refcount,
        usage_count=s.usage_count,
        frames=s.frames,
        batches=s.batches,
        failures=s.failures,
        inference_ms_total=s.inference_seconds * 1000,
        mean_ms_per_frame=s.mean_ms_per_frame,
        queue_frames=s.queue_frames,
        queue_ns=s.queue_ns,
        compute_input_ns=s.input_ns,
        compute_infer_ns=s.infer_ns,
        compute_output_ns=s.output_ns,
        last_used=s.last_used_wall,
        loaded_at=model.loaded_at,
        load_seconds=model.load_seconds,
        last_error=last_error,
    )
