"""Whether a link is queueing, from when our packets were sent and when they arrived.

The delay-based half of the call's bandwidth estimate (``docs/design/link.md`` §19),
the scheme of Google Congestion Control (draft-ietf-rmcat-gcc-02 §5) as libwebrtc runs
it for transport-cc feedback:

1. **Groups.** Packets sent within :data:`GROUP_S` of a group's first are one group (a
   frame's packets, a burst); each new group gives one delay sample: how much later it
   arrived after the previous group than it was sent after it. A queue that grows
   makes the samples positive; a queue that drains, negative.
2. **Trend.** The samples are summed, smoothed and fitted by least squares over the
   last :data:`TREND_WINDOW` groups; the slope (ms of queue per ms) times the number of
   samples seen (at most 60) and :data:`THRESHOLD_GAIN` is the signal.
3. **Detector.** The signal against an adaptive threshold (it follows the signal's own
   size, slowly up and quickly down, within 6–600): above it for more than 10 ms and
   rising is *overuse*, below its negative *underuse*, else *normal*.

Time is in seconds; arrival times are on the receiver's clock, send times on ours: only
differences within one clock are used.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

#: Packets sent within this of a group's first packet are one group (5 ms).
GROUP_S = 0.005
#: Groups the trend is fitted over.
TREND_WINDOW = 20
#: Smoothing of the accumulated delay (the weight of the previous value).
SMOOTHING = 0.9
#: How much the trend is scaled before it meets the threshold.
THRESHOLD_GAIN = 4.0
#: The threshold: its start and bounds, and how fast it follows the signal up and down.
THRESHOLD_START = 12.5
THRESHOLD_MIN, THRESHOLD_MAX = 6.0, 600.0
K_UP, K_DOWN = 0.0087, 0.039
#: Signal above the threshold for longer than this (and rising) is overuse.
OVERUSE_TIME_S = 0.010


class Usage(enum.Enum):
    NORMAL = "normal"
    OVERUSE = "overuse"
    UNDERUSE = "underuse"


@dataclass
class _Group:
    first_send: float
    last_send: float
    last_arrival: float
    size: int


class DelayDetector:
    """Feeds on (send time, arrival time, size) per packet, in send order; says whether
    the link is overused (see the module doc)."""

    def __init__(self) -> None:
        self._group: _Group | None = None
        self._previous: _Group | None = None
        self._accumulated = 0.0
        self._smoothed = 0.0
        self._points: deque[tuple[float, float]] = deque(maxlen=TREND_WINDOW)
        self._first_arrival: float | None = None
        self._samples = 0
        self._threshold = THRESHOLD_START
        self._last_threshold_update: float | None = None
        self._time_over = -1.0
        self._over_count = 0
        self._previous_trend = 0.0
        self.usage = Usage.NORMAL
        self.signal = 0.0  # the last modified trend, for reports

    @property
    def threshold(self) -> float:
        return self._threshold

    def add(self, send_s: float, arrival_s: float, size: int) -> Usage:
        """One packet that arrived; returns the usage now."""
        group = self._group
        if group is None:
            self._group = _Group(send_s, send_s, arrival_s, size)
            return self.usage
        if send_s < group.first_send:  # reordered on the way: nothing to learn
            return self.usage
        if send_s - group.first_send <= GROUP_S:
            group.last_send = max(group.last_send, send_s)
            group.last_arrival = max(group.last_arrival, arrival_s)
            group.size += size
            return self.usage
        if self._previous is not None:
            self._delta(group, self._previous)
        self._previous = group
        self._group = _Group(send_s, send_s, arrival_s, size)
        return self.usage

    def _delta(self, group: _Group, previous: _Group) -> None:
        send_delta = group.last_send - previous.last_send
        arrival_delta = group.last_arrival - previous.last_arrival
        if arrival_delta < 0 or send_delta <= 0:  # clock jump or reordering
            return
        delay_ms = 1000 * (arrival_delta - send_delta)
        self._samples += 1
        self._accumulated += delay_ms
        self._smoothed = SMOOTHING * self._smoothed + (1 - SMOOTHING) * self._accumulated
        if self._first_arrival is None:
            self._first_arrival = group.last_arrival
        self._points.append((1000 * (group.last_arrival - self._first_arrival), self._smoothed))
        if len(self._points) < TREND_WINDOW:
            return
        trend = _slope(self._points)
        self.signal = min(self._samples, 60) * trend * THRESHOLD_GAIN
        self._detect(trend, 1000 * send_delta, group.last_arrival)

    def _detect(self, trend: float, send_delta_ms: float, now: float) -> None:
        signal = self.signal
        if signal > self._threshold:
            if self._time_over < 0:
                self._time_over = send_delta_ms / 2
            else:
                self._time_over += send_delta_ms
            self._over_count += 1
            if (
                self._time_over > 1000 * OVERUSE_TIME_S
                and self._over_count > 1
                and trend >= self._previous_trend
            ):
                self._time_over = 0.0
                self._over_count = 0
                self.usage = Usage.OVERUSE
        elif signal < -self._threshold:
            self._time_over = -1.0
            self._over_count = 0
            self.usage = Usage.UNDERUSE
        else:
            self._time_over = -1.0
            self._over_count = 0
            self.usage = Usage.NORMAL
        self._previous_trend = trend
        self._adapt(signal, now)

    def _adapt(self, signal: float, now: float) -> None:
        last = self._last_threshold_update
        self._last_threshold_update = now
        if last is None:
            return
        size = abs(signal)
        if size > self._threshold + 15:  # a spike: not what the threshold should follow
            return
        k = K_DOWN if size < self._threshold else K_UP
        step_ms = min(1000 * (now - last), 100.0)
        self._threshold += k * (size - self._threshold) * step_ms
        self._threshold = min(max(self._threshold, THRESHOLD_MIN), THRESHOLD_MAX)


def _slope(points: deque[tuple[float, float]]) -> float:
    """Least-squares slope of ``points`` (x, y)."""
    count = len(points)
    mean_x = sum(x for x, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    numerator = sum((x - mean_x) * (y - mean_y) for x, y in points)
    denominator = sum((x - mean_x) ** 2 for x, _ in points)
    return numerator / denominator if denominator else 0.0


#: A queue this deep (seconds over the least one-way delay seen lately) for
#: :data:`STANDING_FOR_S` is a standing queue, whatever its trend says.
STANDING_QUEUE_S = 0.04
STANDING_FOR_S = 0.5
#: The least one-way delay is kept per second over this many seconds.
BASE_WINDOW_S = 30


class QueueGuard:
    """How deep the queue on the path is now, from each packet's one-way delay.

    The trend (:class:`DelayDetector`) sees a queue that grows; one that stays (the
    rate settled just above the link's, or a burst that never drained) has no slope and
    keeps every frame late. The one-way delay (arrival on the caller's clock less send
    on ours: an unknown constant plus the queue) over its least value of the last
    :data:`BASE_WINDOW_S` seconds is the queue itself; :meth:`standing` says when it
    has been over :data:`STANDING_QUEUE_S` for :data:`STANDING_FOR_S`.
    """

    def __init__(self) -> None:
        self._minima: deque[tuple[int, float]] = deque()  # (second, least delay in it)
        self.queue_s = 0.0
        self._deep_since: float | None = None

    def add(self, send_s: float, arrival_s: float) -> None:
        delay = arrival_s - send_s
        second = int(send_s)
        minima = self._minima
        if minima and minima[-1][0] == second:
            if delay < minima[-1][1]:
                minima[-1] = (second, delay)
        else:
            minima.append((second, delay))
        while minima and minima[0][0] < second - BASE_WINDOW_S:
            minima.popleft()
        base = min(value for _, value in minima)
        self.queue_s = 0.8 * self.queue_s + 0.2 * (delay - base)

    def standing(self, now: float) -> bool:
        """Whether the queue has been deep for :data:`STANDING_FOR_S` by ``now``."""
        if self.queue_s <= STANDING_QUEUE_S:
            self._deep_since = None
            return False
        if self._deep_since is None:
            self._deep_since = now
        return now - self._deep_since >= STANDING_FOR_S

    def drained(self) -> None:
        """The rate was cut for the queue: judge it afresh."""
        self._deep_since = None
