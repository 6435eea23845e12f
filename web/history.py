"""A bounded in-process history of the admin figures, for the admin page's charts.

One task (:class:`HistorySampler`, started and stopped by the app's cleanup context in
:mod:`web.admin`) reads the same snapshots ``/admin/stats`` and ``/admin/sessions`` read
(``InferenceCore.snapshot()``, ``SessionManager.snapshot()``) every ``interval_s``
(``server.history_interval_s``) and appends one point per series to a :class:`History`
of ``server.history_points`` points per series; nothing is done per frame.

Series, keyed by ``(scope, subject, name)``:

- ``device`` (subject: the device's name): ``busy_share`` (the workers' busy time over
  the interval, 0..1), ``queue_depth``, ``mean_batch`` (frames per batch run over the
  interval);
- ``session`` (subject: the session id): ``fps``, ``delay_p95_ms`` (server-added delay),
  ``dropped`` (frames dropped since the call started) and ``dropped:<reason>``; and for
  a call with a link (``docs/design/link.md`` §19) ``link_estimate_kbps``,
  ``link_sent_kbps``, ``link_loss_pct`` and ``link_rtt_ms`` (once measured);
- ``server`` (subject ``server``): ``live_sessions``, ``speaking_sessions``,
  ``cpu_ms_per_frame`` (once admission measured it), ``shared_fps`` and ``encoded_fps``
  (video frames per second sent from shared idle loops and encoded by the calls).

Bounded twice: a series keeps at most ``points`` points (a ring), and the history holds
at most ``max_series`` series. A series that gets no new point (a session that ended, a
device gone) is dropped once its last point is older than the window
(``points * interval_s``); past the cap, the series whose last point is oldest (the
longest-ended) go first, so live series are the last to be dropped, and of those,
sessions' before the devices' and the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from inference_core.serving.snapshot import CoreSnapshot
from streaming.live.snapshot import SessionsSnapshot

__all__ = [
    "HISTORY_INTERVAL_S",
    "HISTORY_POINTS",
    "MAX_SERIES",
    "History",
    "HistorySampler",
    "Scope",
    "Series",
    "SeriesKey",
]

logger = logging.getLogger(__name__)

#: Five minutes at one point every two seconds (the settings' defaults).
HISTORY_POINTS = 150
HISTORY_INTERVAL_S = 2.0
#: Enough for a few devices and well over a hundred calls' series.
MAX_SERIES = 512

Scope = Literal["device", "session", "server"]
SeriesKey = tuple[Scope, str, str]  # scope, subject, name
_SCOPE_RANK: dict[Scope, int] = {"session": 0, "device": 1, "server": 2}


@dataclass
class Series:
    """One figure over time: parallel rings of timestamps (Unix seconds) and values."""

    points: int
    t: deque[float] = field(init=False)
    v: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self.t = deque(maxlen=self.points)
        self.v = deque(maxlen=self.points)

    @property
    def last_t(self) -> float:
        return self.t[-1]

    def add(self, t: float, value: float) -> None:
        self.t.append(t)
        self.v.append(value)


class History:
    """At most ``max_series`` series of at most ``points`` points each."""

    def __init__(
        self,
        *,
        points: int = HISTORY_POINTS,
        interval_s: float = HISTORY_INTERVAL_S,
        max_series: int = MAX_SERIES,
    ) -> None:
        if points < 1 or max_series < 1 or interval_s <= 0:
            raise ValueError("a history needs points >= 1, max_series >= 1, interval_s > 0")
        self.points = points
        self.interval_s = interval_s
        self.max_series = max_series
        self._series: dict[SeriesKey, Series] = {}

    def __len__(self) -> int:
        return len(self._series)

    def add(self, key: SeriesKey, t: float, value: float) -> None:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series(self.points)
        series.add(t, value)

    def prune(self, now: float) -> None:
        """Drop series that got no point within the window, then the oldest past the cap."""
        window = self.points * self.interval_s
        for key in [k for k, s in self._series.items() if now - s.last_t > window]:
            del self._series[key]
        excess = len(self._series) - self.max_series
        if excess > 0:
            for key in sorted(self._series, key=self._keep_order)[:excess]:
                del self._series[key]

    def _keep_order(self, key: SeriesKey) -> tuple[float, int, int]:
        # The oldest last point goes first; at the same time, sessions before devices and
        # the server, and the newest series (fewest points) first, so that past the cap
        # the series kept stay the same ones instead of being replaced every sample.
        series = self._series[key]
        return series.last_t, _SCOPE_RANK[key[0]], len(series.t)

    def items(self) -> list[tuple[SeriesKey, Series]]:
        """Every series, sorted by key (scope, subject, name)."""
        return sorted(self._series.items())

    def get(self, key: SeriesKey) -> Series | None:
        return self._series.get(key)


Snapshots = tuple[CoreSnapshot, SessionsSnapshot]


class HistorySampler:
    """Appends the snapshots' figures to ``history`` every ``history.interval_s``.

    ``read`` returns the two snapshots; ``clock`` gives Unix seconds (injected so a test
    drives time by hand and calls :meth:`sample` itself).
    """

    def __init__(
        self,
        history: History,
        read: Callable[[], Awaitable[Snapshots]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.history = history
        self._read = read
        self._clock = clock
        self._previous: tuple[float, Snapshots] | None = None
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> float:
        """Read the snapshots now, add one point per series, prune; return the time used."""
        core, live = await self._read()
        now = self._clock()
        self.record(now, core, live)
        return now

    def record(self, now: float, core: CoreSnapshot, live: SessionsSnapshot) -> None:
        """Add the points of one pair of snapshots taken at ``now``."""
        h = self.history
        previous = self._previous
        elapsed = None if previous is None else now - previous[0]
        before = {} if previous is None else {d.name: d for d in previous[1][0].devices}
        for device in core.devices:
            s = device.scheduler
            frames = sum(w.frames for w in s.workers)
            busy = sum(w.busy_seconds for w in s.workers)
            old = before.get(device.name)
            if old is None or elapsed is None or elapsed <= 0:
                busy_share, mean_batch = s.busy_fraction, s.mean_batch_size
            else:
                o = old.scheduler
                batches = s.batches - o.batches
                share = (busy - sum(w.busy_seconds for w in o.workers)) / (
                    elapsed * max(1, len(s.workers))
                )
                busy_share = min(1.0, max(0.0, share))
                mean_batch = (
                    (frames - sum(w.frames for w in o.workers)) / batches if batches > 0 else 0.0
                )
            h.add(("device", device.name, "busy_share"), now, round(busy_share, 4))
            h.add(("device", device.name, "queue_depth"), now, float(s.queue_depth))
            h.add(("device", device.name, "mean_batch"), now, round(mean_batch, 3))
        # Unpacked by pattern: tests/test_snapshots.py flags `.sessions` outside a snapshot().
        match live:
            case SessionsSnapshot(sessions=calls):
                pass
        for session in calls:
            sid = session.session_id
            h.add(("session", sid, "fps"), now, round(session.output_fps, 2))
            h.add(("session", sid, "delay_p95_ms"), now, round(session.added_delay_ms.p95, 1))
            h.add(("session", sid, "dropped"), now, float(sum(session.frames_dropped.values())))
            for reason, count in session.frames_dropped.items():
                h.add(("session", sid, f"dropped:{reason}"), now, float(count))
            link = session.link
            if link is not None:
                h.add(
                    ("session", sid, "link_estimate_kbps"), now, round(link.estimate_bps / 1e3, 1)
                )
                h.add(("session", sid, "link_sent_kbps"), now, round(link.sent_bps / 1e3, 1))
                h.add(("session", sid, "link_loss_pct"), now, round(100 * link.loss, 2))
                if link.rtt_ms is not None:
                    h.add(("session", sid, "link_rtt_ms"), now, link.rtt_ms)
        totals = live.totals
        h.add(("server", "server", "live_sessions"), now, float(totals.live))
        h.add(("server", "server", "speaking_sessions"), now, float(totals.speaking))
        if totals.cpu_ms_per_frame is not None:
            h.add(("server", "server", "cpu_ms_per_frame"), now, round(totals.cpu_ms_per_frame, 2))
        if previous is not None and elapsed is not None and elapsed > 0:
            old_totals = previous[1][1].totals
            shared = (totals.frames_shared - old_totals.frames_shared) / elapsed
            encoded = (totals.frames_encoded - old_totals.frames_encoded) / elapsed
            h.add(("server", "server", "shared_fps"), now, round(max(0.0, shared), 2))
            h.add(("server", "server", "encoded_fps"), now, round(max(0.0, encoded), 2))
        h.prune(now)
        self._previous = (now, (core, live))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="admin-history-sampler")

    async def stop(self, timeout_s: float = 5.0) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout_s)

    async def _run(self) -> None:
        interval = self.history.interval_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            while True:
                try:
                    await self.sample()
                except Exception:  # a bad sample must not end the history
                    logger.exception("the admin history could not take a sample")
                next_at = max(next_at + interval, loop.time())
                await asyncio.sleep(next_at - loop.time())
        except asyncio.CancelledError:
            logger.debug("the admin history sampler stopped")
            raise
