"""What a device's :class:`~inference_core.serving.scheduler.DeviceScheduler` counts.

Counting follows Triton's statistics (``docs/design/serving.md`` §4): frames vs batches
run, per-batch-size counts, per-model success/failure/expiry, busy time. Every accepted
frame ends in exactly one bucket, so at any moment::

    submitted == completed + expired + failed + shut_down + dropped + queue_depth + in_flight
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

# Weight of the newest batch in a model's run-time estimate. A moving average follows a
# model that gets slower (a busier device) within a few batches without jumping on one
# outlier.
RUN_ESTIMATE_WEIGHT = 0.2


@dataclass(frozen=True)
class WorkerStats:
    """One worker thread: batches and frames it ran (successful or not), time spent running.

    ``alive`` is whether the slot's thread runs now (a dead one is being replaced).
    """

    name: str
    batches: int
    frames: int
    busy_seconds: float
    alive: bool


@dataclass(frozen=True)
class ModelBatchStats:
    """One model on this device: frames completed, batches run, frames expired and failed."""

    frames: int
    batches: int
    expired: int
    failed: int


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of one device's scheduler.

    ``submitted`` counts accepted frames (including ones already late at submit, which
    count as ``expired`` at once); ``rejected`` counts frames refused because the queue
    was full. ``shut_down`` frames were pending when :meth:`stop` ran, ``dropped`` ones
    were pending when their model was dropped. ``busy_fraction`` is the share of the
    workers' time since start spent inside ``run_batch``. ``workers_restarted`` counts
    worker threads that died and were replaced (their batch counts as ``failed``).
    """

    device: str
    queue_depth: int
    queue_size: int
    in_flight: int
    submitted: int
    rejected: int
    expired: int
    failed: int
    completed: int
    shut_down: int
    dropped: int
    batches: int
    mean_batch_size: float
    batch_sizes: dict[int, int]
    busy_seconds: float
    busy_fraction: float
    workers: tuple[WorkerStats, ...]
    models: dict[str, ModelBatchStats]
    workers_restarted: int


@dataclass
class _ModelCounters:
    frames: int = 0
    batches: int = 0
    expired: int = 0
    failed: int = 0
    run_estimate: float = 0.0  # seconds per batch, moving average; 0 until a batch ran


@dataclass
class _WorkerCounters:
    name: str
    batches: int = 0
    frames: int = 0
    busy_seconds: float = 0.0


@dataclass
class StatsRecorder:
    """The mutable counters behind :class:`SchedulerStats`.

    Not thread-safe on purpose: the scheduler only calls it while holding its lock, and a
    second lock would just be taken in the same places.
    """

    worker_names: list[str]
    submitted: int = 0
    rejected: int = 0
    expired: int = 0
    failed: int = 0
    completed: int = 0
    shut_down: int = 0
    dropped: int = 0
    workers_restarted: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    _models: dict[str, _ModelCounters] = field(default_factory=dict)
    _workers: list[_WorkerCounters] = field(init=False)

    def __post_init__(self) -> None:
        self._workers = [_WorkerCounters(name) for name in self.worker_names]

    def _model(self, model_id: str) -> _ModelCounters:
        counters = self._models.get(model_id)
        if counters is None:
            counters = self._models[model_id] = _ModelCounters()
        return counters

    def run_estimate(self, model_id: str) -> float:
        """How long a batch of ``model_id`` has recently taken (0.0 when unknown)."""
        counters = self._models.get(model_id)
        return counters.run_estimate if counters is not None else 0.0

    def record_expired(self, model_id: str, count: int) -> None:
        self.expired += count
        self._model(model_id).expired += count

    def record_batch(
        self, worker: int, model_id: str, size: int, busy_seconds: float, *, ok: bool
    ) -> None:
        """Count one ``run_batch`` call of ``size`` frames that took ``busy_seconds``."""
        model = self._model(model_id)
        model.batches += 1
        if model.batches == 1:
            model.run_estimate = busy_seconds
        else:
            model.run_estimate += RUN_ESTIMATE_WEIGHT * (busy_seconds - model.run_estimate)
        if ok:
            self.completed += size
            model.frames += size
        else:
            self.failed += size
            model.failed += size
        self.batch_sizes[size] += 1
        counters = self._workers[worker]
        counters.batches += 1
        counters.frames += size
        counters.busy_seconds += busy_seconds

    def snapshot(
        self,
        device: str,
        *,
        queue_depth: int,
        queue_size: int,
        in_flight: int,
        running_seconds: float,
        alive: Sequence[bool],
    ) -> SchedulerStats:
        """Freeze the counters; ``running_seconds`` is the time since the workers started,
        ``alive`` says per worker slot whether its thread runs now."""
        batches = sum(self.batch_sizes.values())
        frames_run = sum(size * count for size, count in self.batch_sizes.items())
        busy = sum(w.busy_seconds for w in self._workers)
        capacity = running_seconds * len(self._workers)
        return SchedulerStats(
            device=device,
            queue_depth=queue_depth,
            queue_size=queue_size,
            in_flight=in_flight,
            submitted=self.submitted,
            rejected=self.rejected,
            expired=self.expired,
            failed=self.failed,
            completed=self.completed,
            shut_down=self.shut_down,
            dropped=self.dropped,
            batches=batches,
            mean_batch_size=frames_run / batches if batches else 0.0,
            batch_sizes=dict(sorted(self.batch_sizes.items())),
            busy_seconds=busy,
            busy_fraction=min(1.0, busy / capacity) if capacity > 0 else 0.0,
            workers=tuple(
                WorkerStats(w.name, w.batches, w.frames, w.busy_seconds, running)
                for w, running in zip(self._workers, alive, strict=True)
            ),
            models={
                model_id: ModelBatchStats(c.frames, c.batches, c.expired, c.failed)
                for model_id, c in self._models.items()
            },
            workers_restarted=self.workers_restarted,
        )
