"""The process's own figures on ``GET /metrics``: what a leak would make grow.

- ``lipstream_event_loop_tasks`` (gauge): asyncio tasks not done on the server's event
  loop, this scrape's own request among them;
- ``lipstream_threads`` (gauge): the process's threads, native ones included
  (``/proc/self/task``: ONNX Runtime's, x264's and gRPC's too);
- prometheus_client's ``ProcessCollector`` (Linux): ``process_resident_memory_bytes``,
  ``process_virtual_memory_bytes``, ``process_open_fds``, ``process_max_fds``,
  ``process_cpu_seconds_total``, ``process_start_time_seconds``: the names every
  Prometheus dashboard knows.

Every call has tasks (its timeline, sender, watchdogs, ...), threads (aiortc decodes a
caller's audio on a thread of its own) and file descriptors (its ICE sockets) while it
lasts; a call that ends gives them back. So with the same calls live these figures come
back to the same values, and one that climbs call after call is a leak
(``benchmarks/soak.py`` holds them against bounds). The tasks are counted on the loop the
scrape is served on: Python offers no way to count another thread's loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_TASKS = Path("/proc/self/task")


def thread_count() -> int:
    """Threads of this process: every OS thread where ``/proc`` lists them (ONNX Runtime's,
    x264's and gRPC's too), else the Python threads."""
    try:
        return len(os.listdir(_TASKS))
    except OSError:  # no /proc (macOS)
        return threading.active_count()


class LoopCollector(Collector):
    """``lipstream_event_loop_tasks`` and ``lipstream_threads``, read at each scrape."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "lipstream_event_loop_tasks",
            "asyncio tasks not done on the server's event loop (this scrape's among them).",
            value=len(asyncio.all_tasks(self._loop)),
        )
        yield GaugeMetricFamily(
            "lipstream_threads",
            "Threads of the server process, native ones included.",
            value=thread_count(),
        )


def add_process_metrics(registry: CollectorRegistry, loop: asyncio.AbstractEventLoop) -> None:
    """Register the process's figures (module doc) in ``registry``, tasks counted on ``loop``."""
    registry.register(LoopCollector(loop))
    ProcessCollector(registry=registry)
