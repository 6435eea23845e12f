"""One device's scheduler: a bounded queue and worker threads that batch frames per model.

Frames from every session of a model wait together, so a worker can run them as one
batch (cross-session dynamic batching). With hundreds of models per device batches are
small, so the batching window is short (``max_wait_ms``, a few ms) and frames whose
deadline passed are dropped, never run late (``docs/design/serving.md`` §4).

How a worker picks its next batch:

1. Frames already past their deadline are failed with :class:`DeadlineExceededError`.
2. A model is *ready* when it has a full batch, its oldest frame has waited
   ``max_wait_ms``, or waiting longer would make its earliest frame miss its deadline
   (given how long the model's batches have recently taken).
3. Of the ready models, the one with the earliest deadline goes first, so a session that
   falls behind is served first; its frames are taken in deadline order.
4. When no model is ready, the worker sleeps on the condition until the first one
   becomes ready or a new frame arrives. Once every worker sleeps so, having looked at
   every frame queued, the scheduler is :attr:`~DeviceScheduler.holding` its frames.

A worker never idles in a batching window while another model's batch is ready: with
many models that wait would be paid by every other session on the device.

Workers are supervised: ``run_batch`` errors cost one batch and the worker carries on,
but a worker can still die (a runner raising ``SystemExit``, a bug in this loop). Then
its batch fails with an :class:`InferenceError`, the death is logged with its traceback
and counted (``workers_restarted``), and a replacement thread with the same name takes
its place, so the device keeps its worker count and no frame is left waiting forever.

Why one module of about 550 lines: the queues, the batch choice, the counters and the
workers' supervision are guarded by one condition variable and change together under
it; what needs no lock lives beside it (:mod:`~inference_core.serving.scheduler_stats`
for the counters, :mod:`~inference_core.serving.arrivals` for who is due).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from inference_core.exceptions import (
    DeadlineExceededError,
    InferenceError,
    QueueFullError,
    ShuttingDownError,
)
from inference_core.serving.arrivals import STALE_S, Arrivals
from inference_core.serving.events import CoreEvents, NoCoreEvents
from inference_core.serving.frame_request import (
    FrameRequest,
    ModelRunner,
    complete_batch,
    deliver,
)
from inference_core.serving.scheduler_stats import SchedulerStats, StatsRecorder

logger = logging.getLogger(__name__)

# (deadline, arrival sequence, enqueued at, request): a heap of these keeps a model's
# frames in deadline order; the sequence breaks ties so requests are never compared.
_Entry = tuple[float, int, float, FrameRequest]

# A worker that dies within this many seconds of starting is replaced only after a
# backoff (doubling up to the cap), so a bug that kills every worker at once does not
# spin up threads and tracebacks as fast as the CPU allows.
_QUICK_DEATH_S = 1.0
_RESTART_BACKOFF_S = (0.05, 1.0)


class _ModelQueue:
    """The pending frames of one model, earliest deadline first, and the runner for them."""

    __slots__ = ("heap", "oldest", "runner")

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.heap: list[_Entry] = []
        self.oldest = math.inf  # earliest enqueue time among pending frames

    def push(self, entry: _Entry) -> None:
        heapq.heappush(self.heap, entry)
        self.oldest = min(self.oldest, entry[2])

    def pop_expired(self, now: float) -> list[_Entry]:
        expired: list[_Entry] = []
        while self.heap and self.heap[0][0] < now:
            expired.append(heapq.heappop(self.heap))
        if expired:
            self._refresh_oldest()
        return expired

    def pop_batch(self, size: int) -> list[_Entry]:
        batch = [heapq.heappop(self.heap) for _ in range(min(size, len(self.heap)))]
        self._refresh_oldest()
        return batch

    def _refresh_oldest(self) -> None:
        self.oldest = min((entry[2] for entry in self.heap), default=math.inf)


@dataclass
class _Job:
    """What a worker took under the lock and handles outside it."""

    runner: ModelRunner | None
    batch: list[FrameRequest]
    expired: list[tuple[FrameRequest, float]]  # (request, seconds late)
    waits: list[float]  # seconds each frame of the batch was queued
    counted: bool = False  # the batch left ``in_flight`` and is in the stats


@dataclass
class _Worker:
    """One worker slot: its current thread and when that thread started (for backoff)."""

    thread: threading.Thread
    started: float = 0.0  # time.monotonic()
    backoff: float = 0.0  # seconds the next replacement waits before serving


class DeviceScheduler:
    """Queues frames for one device and runs them in per-model batches on worker threads.

    ``submit`` is called on the event loop and only takes a short lock. Deadlines are on
    ``clock`` (``time.monotonic`` unless a test injects another clock). ``events`` hears
    about every batch run (it may be replaced before :meth:`start`).
    """

    def __init__(
        self,
        name: str,
        *,
        workers: int,
        queue_size: int,
        max_batch_size: int,
        max_wait_ms: float,
        clock: Callable[[], float] = time.monotonic,
        events: CoreEvents | None = None,
    ) -> None:
        if workers < 1 or queue_size < 1 or max_batch_size < 1:
            raise ValueError(
                f"device {name}: workers ({workers}), queue_size ({queue_size}) and "
                f"max_batch_size ({max_batch_size}) must be at least 1"
            )
        if max_wait_ms < 0:
            raise ValueError(f"device {name}: max_wait_ms must be >= 0, got {max_wait_ms}")
        self.name = name
        self._queue_size = queue_size
        self._max_batch_size = max_batch_size
        self._max_wait = max_wait_ms / 1000.0
        self._clock = clock
        self.events: CoreEvents = events or NoCoreEvents()
        self._thread_names = [f"lipstream-{name}-w{i}" for i in range(workers)]
        # One condition guards every field below; workers wait on it for frames.
        self._cond = threading.Condition()
        self._queues: dict[str, _ModelQueue] = {}
        self._arrivals = Arrivals()  # whom a waiting batch can still expect
        self._arrivals_pruned_at = -math.inf
        self._pending = 0
        self._in_flight = 0
        self._sequence = itertools.count()
        self._stats = StatsRecorder(list(self._thread_names))
        self._workers: list[_Worker] = []  # one slot per worker index, its current thread
        self._retired: list[threading.Thread] = []  # replaced threads, maybe still exiting
        self._started_at: float | None = None
        self._stopping = False
        self._stopped = threading.Event()  # cuts a replacement's backoff short
        # For ``holding``: workers asleep in ``_next_job`` and whether a frame came in
        # since a worker last looked. Plain fields under the lock the hot path already
        # takes, so observing the decision costs no allocation and no second lock.
        self._asleep = 0
        self._unseen = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker threads (``lipstream-<name>-w<i>``); :meth:`stop` joins them."""
        with self._cond:
            if self._stopping:
                raise ShuttingDownError(f"device {self.name} is shut down; cannot start it again")
            if self._workers:
                raise RuntimeError(f"device {self.name} scheduler is already started")
            self._started_at = self._clock()
            now = time.monotonic()
            self._workers = [
                _Worker(self._spawn(index, 0.0), now) for index in range(len(self._thread_names))
            ]
        logger.info(
            "device %s scheduler started: workers=%d queue_size=%d max_batch_size=%d "
            "max_wait_ms=%.1f",
            self.name,
            len(self._workers),
            self._queue_size,
            self._max_batch_size,
            self._max_wait * 1000,
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting frames, let running batches finish, fail the rest, join workers.

        Synchronous (run it in an executor from async code) and idempotent. Frames still
        pending fail with :class:`ShuttingDownError`; batches already running deliver
        their results. Workers that do not exit within ``timeout`` seconds are logged.
        """
        with self._cond:
            leftovers: list[FrameRequest] = []
            if not self._stopping:
                self._stopping = True
                leftovers = [entry[3] for q in self._queues.values() for entry in q.heap]
                self._queues.clear()
                self._pending = 0
                self._stats.shut_down += len(leftovers)
            self._stopped.set()
            self._cond.notify_all()
            # No worker is replaced once stopping is set, so this list is complete.
            threads = [worker.thread for worker in self._workers] + self._retired
        if leftovers:
            logger.info("device %s stopping: %d pending frames not run", self.name, len(leftovers))
        closing = ShuttingDownError(f"device {self.name} is shutting down; frame not run")
        deliver([(request, None, closing) for request in leftovers])
        until = time.monotonic() + timeout
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(max(0.0, until - time.monotonic()))
        stuck = [thread.name for thread in threads if thread.is_alive() and thread is not current]
        if stuck:
            logger.error(
                "device %s: worker threads %s did not exit within %.1f s (stuck in run_batch?)",
                self.name,
                ", ".join(stuck),
                timeout,
            )

    # -- the event-loop side ----------------------------------------------------------------

    def submit(self, request: FrameRequest, runner: ModelRunner) -> None:
        """Queue ``request`` to run on ``runner``; its future completes from a worker.

        Raises :class:`ShuttingDownError` once :meth:`stop` began and
        :class:`QueueFullError` when ``queue_size`` frames are already pending. A request
        whose deadline already passed is not queued: its future fails at once with
        :class:`DeadlineExceededError`.
        """
        model_id = runner.model_id
        if request.model_id != model_id:
            raise ValueError(
                f"frame for model {request.model_id!r} submitted with the runner of {model_id!r}"
            )
        with self._cond:
            if self._stopping:
                raise ShuttingDownError(f"device {self.name} is shutting down; frame not accepted")
            now = self._clock()
            late = now - request.deadline
            if late > 0:
                self._stats.submitted += 1
                self._stats.record_expired(model_id, 1)
            else:
                if self._pending >= self._queue_size:
                    self._stats.rejected += 1
                    raise QueueFullError(
                        f"device {self.name} queue is full ({self._pending} frames waiting); "
                        "try again later"
                    )
                queue = self._queues.get(model_id)
                if queue is None:
                    queue = self._queues[model_id] = _ModelQueue(runner)
                else:
                    queue.runner = runner  # a reloaded model's newest runner serves its frames
                queue.push((request.deadline, next(self._sequence), now, request))
                if request.session_id is not None:
                    self._arrivals.note(model_id, request.session_id, now)
                if now - self._arrivals_pruned_at > STALE_S:
                    self._arrivals.forget_stale(now)
                    self._arrivals_pruned_at = now
                self._pending += 1
                self._unseen = True
                self._stats.submitted += 1
                # One waiter is enough: whoever takes a batch wakes the next if work is left.
                # A worker that is not asleep looks at every queue before it sleeps again.
                if self._asleep:
                    self._cond.notify()
                return
        request.fail(_expired_error(model_id, late))

    def drop_model(self, model_id: str, error: InferenceError | None = None) -> int:
        """Fail and remove every pending frame of ``model_id``; return how many.

        Used when a model is unloaded. A batch of it that is already running finishes (the
        worker holds the runner until then). Frames fail with ``error`` if given.
        """
        with self._cond:
            queue = self._queues.pop(model_id, None)
            if queue is None:
                return 0
            requests = [entry[3] for entry in queue.heap]
            self._pending -= len(requests)
            self._stats.dropped += len(requests)
        error = error or InferenceError(
            f"model {model_id} was unloaded from device {self.name}; frame not run"
        )
        deliver([(request, None, error) for request in requests])
        logger.info(
            "device %s: dropped %d pending frames of %s", self.name, len(requests), model_id
        )
        return len(requests)

    @property
    def queue_depth(self) -> int:
        """Frames waiting on this device (all models), not counting running batches."""
        with self._cond:
            return self._pending

    def pending_for(self, model_id: str) -> int:
        """Frames of ``model_id`` waiting on this device."""
        with self._cond:
            queue = self._queues.get(model_id)
            return len(queue.heap) if queue is not None else 0

    @property
    def holding(self) -> bool:
        """True when every worker is asleep, having looked at every frame queued so far.

        Frames still pending are then held on purpose: none of their batches is ready
        (full, past its window, or with no partner due) as of the worker's last look.
        A test awaits this, then asserts a batch did *not* run, instead of sleeping and
        hoping. A move of ``clock`` is not a new frame: it is seen when a worker's wait
        times out, so after one, await the frames' results rather than this.
        """
        with self._cond:
            workers = len(self._workers)
            return not self._stopping and not self._unseen and 0 < workers == self._asleep

    def stats(self) -> SchedulerStats:
        """A consistent snapshot of this device's counters."""
        with self._cond:
            now = self._clock()
            return self._stats.snapshot(
                self.name,
                queue_depth=self._pending,
                queue_size=self._queue_size,
                in_flight=self._in_flight,
                running_seconds=now - self._started_at if self._started_at is not None else 0.0,
                # Before start() there are no threads: no slot is alive.
                alive=[worker.thread.is_alive() for worker in self._workers]
                or [False] * len(self._thread_names),
            )

    # -- the worker side ----------------------------------------------------------------------

    def _spawn(self, index: int, delay: float) -> threading.Thread:
        """Start a thread for worker slot ``index`` (called with the lock held)."""
        # Daemon threads: a run_batch stuck in native code must not keep the process
        # alive after stop() gave up on it (stop logs which thread that was).
        thread = threading.Thread(
            target=self._work, args=(index, delay), name=self._thread_names[index], daemon=True
        )
        thread.start()  # under the lock, so stop() never sees a thread it cannot join
        return thread

    def _work(self, index: int, delay: float) -> None:
        name = self._thread_names[index]
        logger.debug("%s started", name)
        job: _Job | None = None
        try:
            if delay > 0:
                self._stopped.wait(delay)
            while True:
                with self._cond:
                    job = self._next_job()
                if job is None:
                    return
                _fail_expired(job.expired)
                if job.runner is not None and job.batch:
                    self._run(index, job)
                job = None
        # Whatever ends a worker (SystemExit from a runner, a bug in this loop) must not
        # strand its frames or shrink the device: this is the one place that catches it.
        except BaseException as exc:
            self._worker_died(index, job, exc)
        finally:
            logger.debug("%s exited", name)

    def _worker_died(self, index: int, job: _Job | None, exc: BaseException) -> None:
        """Fail the dead worker's frames, count the death and start its replacement."""
        name = self._thread_names[index]
        batch = job.batch if job is not None else []
        model_id = job.runner.model_id if job is not None and job.runner is not None else None
        now = time.monotonic()
        replacement: threading.Thread | None = None
        lost = 0  # frames taken from the queue but never counted as run
        with self._cond:
            if job is not None and job.runner is not None and batch and not job.counted:
                lost = len(batch)
                self._in_flight -= lost
                self._stats.record_batch(index, job.runner.model_id, lost, 0.0, ok=False)
                job.counted = True
            slot = self._workers[index]
            if not self._stopping:
                quick = now - slot.started < _QUICK_DEATH_S
                low, high = _RESTART_BACKOFF_S
                backoff = min(high, max(low, 2 * slot.backoff)) if quick else 0.0
                try:
                    replacement = self._spawn(index, backoff)
                except RuntimeError:  # "can't start new thread": nothing left to try
                    logger.exception("device %s: cannot replace worker %s", self.name, name)
                else:
                    self._retired = [t for t in self._retired if t.is_alive()]
                    self._retired.append(slot.thread)
                    self._workers[index] = _Worker(replacement, now + backoff, backoff)
                    self._stats.workers_restarted += 1
        logger.error(
            "device %s: worker %s died (%r) with %d frames of %s in flight; %s",
            self.name,
            name,
            exc,
            lost,
            model_id or "no model",
            "replaced it" if replacement is not None else "not replaced",
            exc_info=exc,
        )
        error = InferenceError(
            f"worker {name} of device {self.name} died ({exc!r}) while running this frame of "
            f"model {model_id}; "
            + ("it was replaced: send the next frame" if replacement else "it was not replaced")
        )
        error.__cause__ = exc
        # fail() is ignored for futures already completed, so a batch that had partly
        # delivered (or expired frames already failed) is safe to fail again.
        deliver([(request, None, error) for request in batch])
        if job is not None:
            _fail_expired(job.expired)

    def _next_job(self) -> _Job | None:
        """Wait for a ready batch (or expired frames to fail); ``None`` once stopping.

        Called with the lock held.
        """
        while not self._stopping:
            now = self._clock()
            self._unseen = False  # this pass looks at every queued frame
            expired: list[tuple[FrameRequest, float]] = []
            best: _ModelQueue | None = None
            best_id = ""
            wake_at = math.inf
            # A linear scan: only models with pending frames are in the dict, and frames
            # leave within milliseconds, so it stays short even with 1,000+ models loaded.
            for model_id, queue in list(self._queues.items()):
                for entry in queue.pop_expired(now):
                    expired.append((entry[3], now - entry[0]))
                if not queue.heap:
                    del self._queues[model_id]
                    continue
                earliest = queue.heap[0][0]
                ready_at = min(
                    queue.oldest + self._max_wait,
                    earliest - self._stats.run_estimate(model_id),
                )
                full = len(queue.heap) >= self._limit(queue.runner)
                if full or ready_at <= now or self._nobody_to_wait_for(model_id, queue, now):
                    if best is None or earliest < best.heap[0][0]:
                        best, best_id = queue, model_id
                else:
                    wake_at = min(wake_at, ready_at)
            if expired:
                self._pending -= len(expired)
                for request, _ in expired:
                    self._stats.record_expired(request.model_id, 1)
            if best is None:
                if expired:  # fail them now, outside the lock, then look again
                    return _Job(None, [], expired, [])
                self._asleep += 1
                try:
                    self._cond.wait(None if wake_at == math.inf else wake_at - now)
                finally:
                    self._asleep -= 1
                continue
            runner = best.runner
            entries = best.pop_batch(self._limit(runner))
            batch = [entry[3] for entry in entries]
            if not best.heap:
                del self._queues[best_id]
            self._pending -= len(batch)
            self._in_flight += len(batch)
            if self._queues:
                self._cond.notify()  # more work may be ready for another worker
            return _Job(runner, batch, expired, [now - entry[2] for entry in entries])
        return None

    def _nobody_to_wait_for(self, model_id: str, queue: _ModelQueue, now: float) -> bool:
        """True when no session missing from the batch is due within the batching window.

        Frames without a session (the raw API) keep the plain window: their callers'
        timing is unknown.
        """
        sessions = {entry[3].session_id for entry in queue.heap}
        if None in sessions:
            return False
        until = queue.oldest + self._max_wait
        return not self._arrivals.partner_expected(model_id, cast(set[str], sessions), until, now)

    def _limit(self, runner: ModelRunner) -> int:
        return max(1, min(self._max_batch_size, runner.max_batch_size))

    def _run(self, index: int, job: _Job) -> None:
        """Run one batch outside the lock; count it before its futures complete."""
        runner, batch, waits = job.runner, job.batch, job.waits
        assert runner is not None
        model_id = runner.model_id
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s runs %d frames of %s (sessions %s)",
                self._thread_names[index],
                len(batch),
                model_id,
                sorted({str(r.session_id) for r in batch}),
            )
        outputs: list[np.ndarray] = []
        error: InferenceError | None = None
        started = self._clock()
        try:
            outputs = runner.run_batch(batch)
            if len(outputs) != len(batch):
                raise InferenceError(
                    f"runner for model {model_id} returned {len(outputs)} outputs "
                    f"for {len(batch)} frames"
                )
        except InferenceError as exc:
            error = exc
            logger.exception(
                "device %s: batch of %d for %s failed", self.name, len(batch), model_id
            )
        except Exception as exc:  # a runner bug must cost one batch, never the worker
            error = InferenceError(f"inference failed on {self.name} for model {model_id}: {exc}")
            error.__cause__ = exc
            logger.exception(
                "device %s: batch of %d for %s failed", self.name, len(batch), model_id
            )
        busy = self._clock() - started
        if error is None:
            runner.count_queue_wait(len(batch), sum(waits))
        with self._cond:
            self._in_flight -= len(batch)
            self._stats.record_batch(index, model_id, len(batch), busy, ok=error is None)
            job.counted = True
        complete_batch(batch, None if error is not None else outputs, error)
        self.events.batch_done(self.name, len(batch), waits, busy)


def _fail_expired(expired: list[tuple[FrameRequest, float]]) -> None:
    """Fail frames that missed their deadline (with how late each was): one hand-off per
    loop for all of them, so an overload that expires many frames at once does not
    wake the loops once per frame."""
    deliver([(request, None, _expired_error(request.model_id, late)) for request, late in expired])


def _expired_error(model_id: str, late_seconds: float) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"frame for model {model_id} missed its deadline by {late_seconds * 1000:.0f} ms; dropped"
    )
