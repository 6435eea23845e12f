"""What the inference core tells an observer as work happens: the seam for metrics.

Counters the core already keeps (:meth:`DeviceScheduler.stats`, the registry's
evictions) are read when someone asks; durations have to be observed as they happen, so
the scheduler and the registry report them to a :class:`CoreEvents`. The core stays free
of any metrics library: ``web/metrics.py`` implements this protocol with Prometheus
histograms, tests with a list.

Hooks are called from device worker and load threads, after the work they report. They
must be cheap and thread-safe and should never raise: a worker whose hook raises dies
and is replaced by the scheduler's supervision, costing that batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class CoreEvents(Protocol):
    """Receives the inference core's timings."""

    def batch_done(
        self, device: str, batch_size: int, queue_waits_s: Sequence[float], run_s: float
    ) -> None:
        """A batch of ``batch_size`` frames ran on ``device`` (successfully or not).

        ``queue_waits_s`` has one entry per frame: the time from its submit to the batch
        being taken; ``run_s`` is the time spent in ``run_batch``.
        """
        ...

    def model_loaded(self, device: str, seconds: float) -> None:
        """A model was opened and warmed up on ``device`` in ``seconds``."""
        ...

    def model_load_failed(self) -> None:
        """A model load failed (missing/corrupt file, out of memory, unexpected error).

        Refusals for lack of room (``CapacityError``) are not failures.
        """
        ...


class NoCoreEvents:
    """The default :class:`CoreEvents`: ignores everything."""

    def batch_done(
        self, device: str, batch_size: int, queue_waits_s: Sequence[float], run_s: float
    ) -> None:
        pass

    def model_loaded(self, device: str, seconds: float) -> None:
        pass

    def model_load_failed(self) -> None:
        pass
