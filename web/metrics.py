"""``GET /metrics``: the server's counters, gauges and histograms for Prometheus.

Two sources, two :class:`~prometheus_client.CollectorRegistry` (no global registry):

* :class:`SnapshotCollector` renders what the server already counts (schedulers, model
  registry, sessions, background cache) from the core's and the session manager's
  snapshots, taken per scrape (a registry made for that scrape), so nothing is counted
  twice and nothing but snapshots is read.
* :class:`MetricsEvents` (in the app's registry, ``app[METRICS]``) observes durations as
  they happen: it implements :class:`~inference_core.serving.events.CoreEvents` (batches
  run, models loaded) and the sessions' ``on_frame_ready`` and ``on_frame_sent`` hooks,
  so neither the core nor the sessions import prometheus.

Labels are bounded: device names, fixed reasons and the frame stages only: the four up to
a frame being ready (they add up to its delay, so their ``_sum`` add up to the total's;
``docs/design/delay.md`` §8), then ``slot_wait`` and ``encode`` once it is sent. Session
ids and model ids are never labels (1,200 models would be 1,200 series per metric);
per-model figures are in the admin JSON API.

Why one module of about 500 lines: the metric table below, the event histograms and the
snapshot collector name the same series; kept together, a metric's name, labels and
source are checked in one place (most of the length is that table).

==========================================  =========  ===========  ====================
metric                                      type       labels       source
==========================================  =========  ===========  ====================
lipstream_sessions_live                     gauge                   sessions
lipstream_sessions_speaking                 gauge                   sessions
lipstream_audio_streams_open                gauge                   sessions
lipstream_sessions_callerless               gauge                   sessions
lipstream_sessions_by_kind                  gauge      kind         sessions
lipstream_viewers                           gauge                   sessions
lipstream_outputs                           gauge                   sessions
lipstream_sessions_total                    counter    event        sessions
lipstream_sessions_ended_total              counter    reason       sessions
lipstream_frames_served_total               counter                 sessions
lipstream_frames_inferred_total             counter                 sessions
lipstream_frames_sent_by_source_total       counter    source       sessions
lipstream_frames_dropped_total              counter    reason       sessions
lipstream_cpu_seconds_per_frame             gauge                   sessions (once
                                                                    measured)
lipstream_frame_delay_seconds               histogram               on_frame_ready
lipstream_frame_stage_seconds               histogram  stage        on_frame_ready,
                                                                    on_frame_sent
lipstream_queue_depth                       gauge      device       scheduler
lipstream_queue_capacity                    gauge      device       scheduler
lipstream_frames_in_flight                  gauge      device       scheduler
lipstream_device_workers                    gauge      device       scheduler
lipstream_device_frames_dropped_total       counter    device,      scheduler
                                                       reason
lipstream_inference_frames_total            counter    device       scheduler
lipstream_inference_failed_frames_total     counter    device       scheduler
lipstream_inference_batches_total           counter    device       scheduler
lipstream_inference_busy_seconds_total      counter    device       scheduler
lipstream_inference_batch_size              histogram  device       scheduler
lipstream_queue_wait_seconds                histogram  device       batch_done
lipstream_batch_inference_seconds           histogram  device       batch_done
lipstream_models_registered                 gauge                   registry
lipstream_models_failed                     gauge                   registry
lipstream_models_loaded                     gauge      device       registry
lipstream_models_loading                    gauge      device       registry
lipstream_device_model_memory_bytes         gauge      device       registry
lipstream_device_memory_used_bytes          gauge      device       memory probe
lipstream_device_memory_total_bytes         gauge      device       memory probe
lipstream_model_evictions_total             counter    reason       registry
lipstream_model_loads_total                 counter    device       model_loaded
lipstream_model_load_failures_total         counter                 model_load_failed
lipstream_model_load_seconds                histogram  device       model_loaded
lipstream_background_cache_bytes            gauge                   cache
lipstream_background_cache_max_bytes        gauge                   cache
lipstream_background_cache_entries          gauge                   cache
lipstream_background_cache_hits_total       counter                 cache
lipstream_background_cache_misses_total     counter                 cache
lipstream_background_cache_evictions_total  counter                 cache
lipstream_idle_loop_cache_bytes             gauge                   idle loops
lipstream_idle_loop_cache_max_bytes         gauge                   idle loops
lipstream_idle_loops                        gauge                   idle loops
lipstream_idle_loops_building               gauge                   idle loops
lipstream_idle_loops_built_total            counter                 idle loops
lipstream_idle_loop_evictions_total         counter                 idle loops
lipstream_idle_loop_build_failures_total    counter                 idle loops
==========================================  =========  ===========  ====================

The calls' links (estimates, round trips, loss, ladder steps, repairs) are listed in
:mod:`web.link_metrics`; the process's own figures (event loop tasks, threads, RSS, open
file descriptors) in :mod:`web.process_metrics`.

``lipstream_frames_dropped_total`` counts live-session frames by why they were not shown
(``deadline``, ``queue_full``, ``shutting_down``, ``overload``, ``late``, ``not_ready``,
``error``); ``lipstream_device_frames_dropped_total`` counts every frame a device scheduler
accepted but did not run (``deadline``, ``shutting_down``, ``model_unloaded``) or refused
(``queue_full``), raw API frames included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import get_args

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from inference_core.serving.snapshot import CoreSnapshot
from streaming.live.reporting import SENDING, STAGES, FrameSending, FrameStages
from streaming.live.snapshot import SessionsSnapshot
from streaming.live.tasks import end_reason_label
from web.app_keys import CORE, METRICS, SESSIONS
from web.link_metrics import link_metrics
from web.process_metrics import add_process_metrics
from web.schemas.base import SessionKind

# The classic text format: every Prometheus version reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Session drop reasons are exception class names or short words (streaming/live/renderer.py);
# anything not listed here is counted as "error", so the label set stays fixed.
_DROP_REASONS = MappingProxyType(
    {
        "DeadlineExceededError": "deadline",
        "QueueFullError": "queue_full",
        "ShuttingDownError": "shutting_down",
        "overload": "overload",
        "late": "late",
        "not_ready": "not_ready",
    }
)

# Bucket bounds. Frames have a delay budget of ~100-200 ms and a batching window of a few
# ms, so the small buckets are fine-grained; loads take from 100 ms (CPU) to a minute.
_QUEUE_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
_BATCH_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_FRAME_DELAY_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
_BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64)


class MetricsEvents:
    """Histograms and counters fed as things happen (from worker, load and loop threads).

    Implements :class:`~inference_core.serving.events.CoreEvents`; :meth:`frame_ready` is the
    sessions' ``on_frame_ready`` hook. prometheus_client metrics are thread-safe.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_wait = Histogram(
            "lipstream_queue_wait_seconds",
            "Time a frame waited in its device queue before its batch was taken.",
            ["device"],
            buckets=_QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.batch_inference = Histogram(
            "lipstream_batch_inference_seconds",
            "Time one batch spent in the model (run_batch), successful or not.",
            ["device"],
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.frame_delay = Histogram(
            "lipstream_frame_delay_seconds",
            "Live sessions: time from a frame's audio being complete to the frame being ready.",
            buckets=_FRAME_DELAY_BUCKETS,
            registry=registry,
        )
        self.frame_stage = Histogram(
            "lipstream_frame_stage_seconds",
            "Live sessions: the frame delay by stage; a frame's stages add up to its delay.",
            ["stage"],
            buckets=(0.001, 0.002, 0.005, *_FRAME_DELAY_BUCKETS),  # a stage may take < 1 ms
            registry=registry,
        )
        # Created at 0; the sending stages follow a frame once ready (FrameSending).
        self._stage_series = [self.frame_stage.labels(stage) for stage in STAGES]
        self._sending_series = [self.frame_stage.labels(stage) for stage in SENDING]
        self.model_load = Histogram(
            "lipstream_model_load_seconds",
            "Time to open and warm up a model on a device.",
            ["device"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.model_loads = Counter(
            "lipstream_model_loads", "Models loaded.", ["device"], registry=registry
        )
        self.model_load_failures = Counter(
            "lipstream_model_load_failures",
            "Model loads that failed (missing or corrupt file, out of memory, unexpected).",
            registry=registry,
        )

    def start_devices(self, devices: Sequence[str]) -> None:
        """Create each device's series at zero, so rates work from the first frame on."""
        for device in devices:
            self.queue_wait.labels(device)
            self.batch_inference.labels(device)
            self.model_load.labels(device)
            self.model_loads.labels(device)

    def batch_done(
        self, device: str, batch_size: int, queue_waits_s: Sequence[float], run_s: float
    ) -> None:
        waits = self.queue_wait.labels(device)
        for wait in queue_waits_s:
            waits.observe(wait)
        self.batch_inference.labels(device).observe(run_s)

    def model_loaded(self, device: str, seconds: float) -> None:
        self.model_load.labels(device).observe(seconds)
        self.model_loads.labels(device).inc()

    def model_load_failed(self) -> None:
        self.model_load_failures.inc()

    def frame_ready(self, stages: FrameStages) -> None:
        self.frame_delay.observe(stages.total)
        for series, seconds in zip(self._stage_series, stages, strict=True):
            series.observe(seconds)

    def frame_sent(self, sending: FrameSending) -> None:
        for series, seconds in zip(self._sending_series, sending, strict=True):
            series.observe(seconds)


class SnapshotCollector(Collector):
    """The server's own counters, from the snapshots taken for one scrape."""

    def __init__(self, core: CoreSnapshot, sessions: SessionsSnapshot) -> None:
        self._core = core
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        yield from self._sessions_metrics()
        yield from self._scheduler_metrics()
        yield from self._registry_metrics()
        yield from self._cache_metrics()
        yield from link_metrics(self._sessions.links(), self._sessions.totals.link)

    def _sessions_metrics(self) -> Iterator[Metric]:
        totals = self._sessions.totals
        yield GaugeMetricFamily("lipstream_sessions_live", "Live sessions.", value=totals.live)
        yield GaugeMetricFamily(
            "lipstream_sessions_speaking",
            "Live sessions whose caller is getting an app's utterance now.",
            value=totals.speaking,
        )
        yield GaugeMetricFamily(
            "lipstream_audio_streams_open",
            "Audio stream WebSockets open (one at most per session).",
            value=totals.audio_streams,
        )
        yield GaugeMetricFamily(
            "lipstream_sessions_callerless",
            "Live sessions no caller owns (POST /sessions).",
            value=totals.callerless,
        )
        by_kind = GaugeMetricFamily(
            "lipstream_sessions_by_kind",
            "Live sessions by kind: call, callerless, whip, livekit (GET /admin/sessions).",
            labels=["kind"],
        )
        kinds = dict.fromkeys(get_args(SessionKind), 0) | totals.by_kind
        for kind, count in kinds.items():
            by_kind.add_metric([kind], count)
        yield by_kind
        yield GaugeMetricFamily("lipstream_viewers", "WHEP viewers watching now.", totals.viewers)
        yield GaugeMetricFamily(
            "lipstream_outputs", "Streams pushed out now (RTMP, WHIP).", totals.outputs
        )
        events = CounterMetricFamily(
            "lipstream_sessions",
            "Sessions by event: started, ended, rejected (at capacity or shutting down), "
            "failed (offer could not be answered).",
            labels=["event"],
        )
        events.add_metric(["started"], totals.started)
        events.add_metric(["ended"], totals.ended)
        events.add_metric(["rejected"], totals.rejected)
        events.add_metric(["failed"], totals.failed)
        yield events
        ended = CounterMetricFamily(
            "lipstream_sessions_ended",
            "Sessions ended, by why: asked to, a watchdog, the connection, or a stage that "
            "failed ('<stage> failed', docs/design/threads.md §7).",
            labels=["reason"],
        )
        by_reason: dict[str, int] = {}
        for reason, count in totals.ended_by_reason.items():
            label = end_reason_label(reason)
            by_reason[label] = by_reason.get(label, 0) + count
        for label, count in sorted(by_reason.items()):
            ended.add_metric([label], count)
        yield ended
        yield CounterMetricFamily(
            "lipstream_frames_served",
            "Video frames sent to callers (lip-synced or idle).",
            value=totals.frames_sent,
        )
        if totals.cpu_ms_per_frame is not None:
            yield GaugeMetricFamily(
                "lipstream_cpu_seconds_per_frame",
                "The process's CPU time per video frame sent over the last ~20 s "
                "(what admission prices a session's frames at, docs/design/delay.md §9).",
                value=totals.cpu_ms_per_frame / 1000.0,
            )
        yield CounterMetricFamily(
            "lipstream_frames_inferred",
            "Live-session frames composed with an inferred face.",
            value=totals.frames_inferred,
        )
        by_source = CounterMetricFamily(
            "lipstream_frames_sent_by_source",
            "Video frames sent: shared (an avatar's shared encoded idle loop) or encoded "
            "(by the call's own encoder).",
            labels=["source"],
        )
        by_source.add_metric(["shared"], totals.frames_shared)
        by_source.add_metric(["encoded"], totals.frames_encoded)
        yield by_source
        by_reason = dict.fromkeys((*_DROP_REASONS.values(), "error"), 0)
        for name, count in totals.frames_dropped.items():
            by_reason[_DROP_REASONS.get(name, "error")] += count
        dropped = CounterMetricFamily(
            "lipstream_frames_dropped",
            "Live-session frames not shown lip-synced, by reason.",
            labels=["reason"],
        )
        for reason, count in by_reason.items():
            dropped.add_metric([reason], count)
        yield dropped

    def _scheduler_metrics(self) -> Iterator[Metric]:
        stats = [device.scheduler for device in self._core.devices]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["device"])

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["device"])

        depth = gauge("lipstream_queue_depth", "Frames waiting in the device queue.")
        capacity = gauge("lipstream_queue_capacity", "Frames the device queue holds at most.")
        in_flight = gauge("lipstream_frames_in_flight", "Frames in batches running now.")
        workers = gauge("lipstream_device_workers", "Worker threads running batches.")
        frames = counter("lipstream_inference_frames", "Frames run through a model.")
        failed = counter("lipstream_inference_failed_frames", "Frames whose batch failed.")
        batches = counter("lipstream_inference_batches", "Batches run.")
        busy = counter(
            "lipstream_inference_busy_seconds", "Worker time spent running batches (all workers)."
        )
        restarted = counter(
            "lipstream_device_workers_restarted", "Worker threads that died and were replaced."
        )
        dropped = CounterMetricFamily(
            "lipstream_device_frames_dropped",
            "Frames a device refused (queue_full) or accepted but did not run.",
            labels=["device", "reason"],
        )
        sizes = HistogramMetricFamily(
            "lipstream_inference_batch_size", "Frames per batch run.", labels=["device"]
        )
        for s in stats:
            device = [s.device]
            depth.add_metric(device, s.queue_depth)
            capacity.add_metric(device, s.queue_size)
            in_flight.add_metric(device, s.in_flight)
            workers.add_metric(device, sum(1 for w in s.workers if w.alive))
            frames.add_metric(device, s.completed + s.failed)
            failed.add_metric(device, s.failed)
            batches.add_metric(device, s.batches)
            busy.add_metric(device, s.busy_seconds)
            restarted.add_metric(device, s.workers_restarted)
            dropped.add_metric([s.device, "deadline"], s.expired)
            dropped.add_metric([s.device, "queue_full"], s.rejected)
            dropped.add_metric([s.device, "shutting_down"], s.shut_down)
            dropped.add_metric([s.device, "model_unloaded"], s.dropped)
            sizes.add_metric(
                device,
                buckets=_cumulative(s.batch_sizes),
                sum_value=sum(size * count for size, count in s.batch_sizes.items()),
            )
        yield from (depth, capacity, in_flight, workers, frames, failed, batches, busy, restarted)
        yield from (dropped, sizes)

    def _registry_metrics(self) -> Iterator[Metric]:
        models = self._core.models
        yield GaugeMetricFamily(
            "lipstream_models_registered", "Models known to the server.", value=len(models)
        )
        yield GaugeMetricFamily(
            "lipstream_models_failed",
            "Models whose last load failed (the next request retries).",
            value=sum(1 for m in models if m.state == "failed"),
        )
        loaded = GaugeMetricFamily("lipstream_models_loaded", "Models loaded.", labels=["device"])
        loading = GaugeMetricFamily(
            "lipstream_models_loading", "Model loads placed, not finished.", labels=["device"]
        )
        model_memory = GaugeMetricFamily(
            "lipstream_device_model_memory_bytes",
            "Memory of the loaded models, as measured around each load.",
            labels=["device"],
        )
        used = GaugeMetricFamily(
            "lipstream_device_memory_used_bytes",
            "Memory in use: the whole GPU (NVML) for cuda, this process's RSS for cpu.",
            labels=["device"],
        )
        total = GaugeMetricFamily(
            "lipstream_device_memory_total_bytes",
            "Memory the device has (capped by devices.max_memory_per_device); absent if unknown.",
            labels=["device"],
        )
        for d in self._core.devices:
            loaded.add_metric([d.name], d.models_loaded)
            loading.add_metric([d.name], d.models_loading)
            model_memory.add_metric([d.name], d.model_memory_bytes)
            used.add_metric([d.name], d.memory_used_bytes)
            if d.memory_total_bytes is not None:
                total.add_metric([d.name], d.memory_total_bytes)
        yield from (loaded, loading, model_memory, used, total)
        evictions = CounterMetricFamily(
            "lipstream_model_evictions",
            "Models unloaded, by reason: capacity (room for a load), idle, admin.",
            labels=["reason"],
        )
        for reason, count in self._core.evictions.items():
            evictions.add_metric([reason], count)
        yield evictions

    def _cache_metrics(self) -> Iterator[Metric]:
        c = self._sessions.cache
        prefix = "lipstream_background_cache"
        yield GaugeMetricFamily(f"{prefix}_bytes", "Bytes of cached frames.", value=c.bytes)
        yield GaugeMetricFamily(
            f"{prefix}_max_bytes", "Cache size limit in bytes.", value=c.max_bytes
        )
        yield GaugeMetricFamily(f"{prefix}_entries", "Frames cached.", value=c.entries)
        yield CounterMetricFamily(f"{prefix}_hits", "Lookups served from memory.", value=c.hits)
        yield CounterMetricFamily(
            f"{prefix}_misses", "Lookups that loaded a frame.", value=c.misses
        )
        yield CounterMetricFamily(
            f"{prefix}_evictions", "Frames dropped to stay within the limit.", value=c.evictions
        )
        loops = self._sessions.idle_loops
        for family, name, doc, value in (
            (
                GaugeMetricFamily,
                "lipstream_idle_loop_cache_bytes",
                "Bytes of encoded idle loops kept.",
                loops.bytes,
            ),
            (
                GaugeMetricFamily,
                "lipstream_idle_loop_cache_max_bytes",
                "Idle loop cache limit in bytes (cache.idle_loop_bytes).",
                loops.max_bytes,
            ),
            (GaugeMetricFamily, "lipstream_idle_loops", "Encoded idle loops kept.", loops.loops),
            (
                GaugeMetricFamily,
                "lipstream_idle_loops_building",
                "Idle loops queued or being encoded.",
                loops.building,
            ),
            (CounterMetricFamily, "lipstream_idle_loops_built", "Idle loops encoded.", loops.built),
            (
                CounterMetricFamily,
                "lipstream_idle_loop_evictions",
                "Idle loops dropped to stay within the limit.",
                loops.evicted,
            ),
            (
                CounterMetricFamily,
                "lipstream_idle_loop_build_failures",
                "Idle loops that failed to encode (their calls encode their own frames).",
                loops.failed,
            ),
        ):
            yield family(name, doc, value=value)


def _cumulative(batch_sizes: dict[int, int]) -> list[tuple[str, float]]:
    """Per-size batch counts as cumulative histogram buckets (``le`` strings, ``+Inf``)."""
    buckets: list[tuple[str, float]] = [
        (str(bound), sum(n for size, n in batch_sizes.items() if size <= bound))
        for bound in _BATCH_SIZE_BOUNDS
    ]
    buckets.append(("+Inf", sum(batch_sizes.values())))
    return buckets


def add_metrics_routes(app: web.Application) -> None:
    """Serve ``GET /metrics``: ``app[METRICS]``'s histograms, counters from per-scrape snapshots.

    The histograms are hooked up on start-up, once the inference core and the session
    manager exist. Models loaded before that (``preload: true``) are counted then.
    """
    registry = CollectorRegistry()
    events = MetricsEvents(registry)
    app[METRICS] = registry

    async def attach(app: web.Application) -> None:
        core, sessions = app[CORE], app[SESSIONS]
        add_process_metrics(registry, asyncio.get_running_loop())
        events.start_devices([device.name for device in core.devices])
        core.set_events(events)
        sessions.on_frame_ready = events.frame_ready
        sessions.on_frame_sent = events.frame_sent
        for model in (await core.snapshot()).models:
            if model.device is not None and model.load_seconds is not None:
                events.model_loaded(model.device, model.load_seconds)

    # on_startup runs after every cleanup_ctx has started, wherever this call is placed.
    app.on_startup.append(attach)
    app.router.add_get("/metrics", serve_metrics)


async def serve_metrics(request: web.Request) -> web.Response:
    """The metrics in the Prometheus text format (0.0.4)."""
    app = request.app
    snapshots = CollectorRegistry()
    snapshots.register(SnapshotCollector(await app[CORE].snapshot(), app[SESSIONS].snapshot()))
    # On the loop, not in a thread: rendering reads values, it computes nothing heavy.
    body = generate_latest(snapshots) + generate_latest(app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
