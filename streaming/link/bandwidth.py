"""The call's bandwidth estimate, from everything its caller reports.

:class:`BandwidthEstimator` is fed the caller's feedback as the link controller reads
it and keeps one number, :attr:`BandwidthEstimator.estimate_bps`: what the call may send
in all, audio and video (``docs/design/link.md`` §19). It runs one of three ways,
chosen by what the caller sends:

- **transport-cc** (browsers, when the answer offers it): per-packet arrival times; our
  delay detector and :class:`~.estimate.RateControl`, a guard against a queue that
  stands without growing (:class:`~.delay_based.QueueGuard`: it is cut like overuse),
  loss from the same feedback, and probes measured by their arrivals. A probe that
  found room lifts the estimate on trial, ramping to the lift over :data:`RAMP_S`
  (a probe a token bucket fooled then overloads the link a little before it is caught,
  not at once by half): if within :data:`TRIAL_S` our packets arrive
  slower than we send them (a token bucket let the probe through and now caps the
  rate) or the link congests, the estimate falls back to what the caller received
  (never below where it was) and probes back off. What the caller received is the
  rate the latest packets arrived at when they queued (behind a queue, the link's own
  rate: the last second's average mixes in the rate before a cap came down, or the
  pause before a keyframe), else the last second's; and when the sender sent under
  :data:`~.estimate.APP_LIMITED` × the estimate with no queue in sight, it measured
  the sender, not the link, and an overuse backs off from the estimate instead
  (:class:`~.estimate.RateControl`);
- **REMB** (a caller that sends only REMB, e.g. aiortc): :class:`~.estimate.RembRate`
  (followed down when it drops or stays under what we send), loss from receiver
  reports;
- neither (a caller that reports only loss): loss alone.

In every case the estimate is the lower of the first two halves and the loss-based
rate. Loss is judged over windows of at least :data:`LOSS_WINDOW_S` and
:data:`LOSS_WINDOW_PACKETS`: over fewer, 5 % random loss would look like 15 % one time
in fourteen and shrink the picture for nothing.
"""

from __future__ import annotations

import enum
import math
from collections import deque

from streaming.link.delay_based import DelayDetector, QueueGuard, Usage
from streaming.link.estimate import (
    APP_LIMITED,
    BETA,
    LOSS_LOW,
    LossBasedRate,
    RateControl,
    RateLimits,
    RembRate,
)
from streaming.link.feedback import Arrival, FeedbackResult, RateWindow
from streaming.link.probes import ProbePlanner

#: How long a probe's lift is on trial, and how long the estimate takes to ramp to it
#: (module doc).
TRIAL_S = 3.0
RAMP_S = 1.0
CHAIN_AFTER_S = 2.0
#: During a trial, packets arriving at under this × the rate they were sent at (over the
#: last TRIAL_WINDOW_S of them, at least TRIAL_PACKETS) means the lift does not hold.
TRIAL_RECEIVED = 0.85
#: Packets arriving at under this × the rate they were sent at, trial or not: the link
#: dropped under the rate (a cap came down) and the estimate is cut at once.
SEVERE_RATIO = 0.6
TRIAL_WINDOW_S = 0.5
TRIAL_PACKETS = 20
LOSS_WINDOW_S = 1.0
LOSS_WINDOW_PACKETS = 50
#: The round trip assumed until one is measured.
DEFAULT_RTT_S = 0.1


class Mode(enum.StrEnum):
    TRANSPORT_CC = "transport-cc"
    REMB = "remb"
    LOSS = "loss"


class BandwidthEstimator:
    """One call's estimate (module doc). Times are seconds on one monotonic clock."""

    def __init__(self, limits: RateLimits, *, transport_cc: bool) -> None:
        self.limits = limits
        self.mode = Mode.TRANSPORT_CC if transport_cc else Mode.LOSS
        self._delay = DelayDetector()
        self._queue = QueueGuard()
        # (the estimate before, since when, the lift it ramps to)
        self._trial: tuple[int, float, float] | None = None
        self._rate = RateControl(limits)
        self._remb = RembRate(limits)
        self._loss = LossBasedRate(limits)
        self._received = RateWindow(1.0)  # on the caller's clock
        self._received_now: float | None = None  # the latest arrival, on that clock
        self._sent = RateWindow(1.0)  # what that feedback covers, by when it was sent
        self._sent_now: float | None = None
        self._recent: deque[Arrival] = deque()  # the last TRIAL_WINDOW_S of arrivals
        self._recent_lost: deque[tuple[float, int]] = deque()  # ... and of packets lost
        self.probes = ProbePlanner(limits.max_bps)
        self.rtt_s = DEFAULT_RTT_S
        self.rtt_measured = False
        self.usage = Usage.NORMAL
        self._lost = self._reported = 0
        self._window_start: float | None = None
        self.last_loss = 0.0
        self.remb_bps: int | None = None
        #: Whether any feedback has moved the estimate yet (until then it is the start
        #: value on transport-cc, the ceiling otherwise: a guess, not a measurement).
        self.measured = False

    @property
    def estimate_bps(self) -> int:
        if self.mode is Mode.TRANSPORT_CC:
            primary = self._rate.bps
        elif self.mode is Mode.REMB:
            primary = self._remb.rate
        else:
            primary = self.limits.max_bps
        return min(primary, self._loss.bps)

    @property
    def received_bps(self) -> float | None:
        """What the caller received lately (transport-cc only)."""
        now = self._received_now
        return None if now is None else self._received.bps(now)

    def round_trip(self, rtt_s: float) -> None:
        """A round trip measured from a receiver report."""
        if rtt_s > 0:
            self.rtt_s = rtt_s if not self.rtt_measured else 0.8 * self.rtt_s + 0.2 * rtt_s
            self.rtt_measured = True

    @property
    def on_trial(self) -> bool:
        """Whether a probe's lift is still on trial."""
        return self._trial is not None

    def may_probe(self, now: float) -> bool:
        """Whether a probe may go out now: none is on trial, or the last lift has ramped
        and held for :data:`CHAIN_AFTER_S` (a freed link is climbed in quick steps; the
        whole chain falls back to where it began if a step does not hold)."""
        return self._trial is None or now - self._trial[1] >= CHAIN_AFTER_S

    @property
    def queue_s(self) -> float:
        """The standing queue the one-way delays say (transport-cc only)."""
        return self._queue.queue_s

    def transport_feedback(self, result: FeedbackResult, now: float) -> None:
        """A transport-cc feedback message, resolved against what was sent."""
        self.mode = Mode.TRANSPORT_CC
        self.measured = self.measured or bool(result.arrivals)
        recent = self._recent
        for arrival in result.arrivals:
            recent.append(arrival)
            self.usage = self._delay.add(arrival.send_s, arrival.arrival_s, arrival.size)
            self._queue.add(arrival.send_s, arrival.arrival_s)
            self._received.add(arrival.arrival_s, arrival.size)
            if self._received_now is None or arrival.arrival_s > self._received_now:
                self._received_now = arrival.arrival_s
        lost = self._recent_lost
        lost_sent = list(result.lost_sent)
        lost.extend(lost_sent)
        for send_s, size in sorted([(a.send_s, a.size) for a in result.arrivals] + lost_sent):
            self._sent.add(send_s, size)
            self._sent_now = send_s if self._sent_now is None else max(self._sent_now, send_s)
        # both kept for the last TRIAL_WINDOW_S of sending: by the latest packet either
        # way (a link that loses everything reports losses only, and they must not pile up)
        latest = max(recent[-1].send_s if recent else -math.inf, lost[-1][0] if lost else -math.inf)
        since = latest - TRIAL_WINDOW_S
        while recent and recent[0].send_s < since:
            recent.popleft()
        while lost and lost[0][0] < since:
            lost.popleft()
        if result.arrivals:
            before = self.estimate_bps
            usage, received = self.usage, self.received_bps
            if usage is Usage.NORMAL and self._queue.standing(now):
                usage = Usage.OVERUSE  # a queue that does not drain by itself
                self._queue.drained()
            ratio = self._arrival_ratio()
            queued = ratio < TRIAL_RECEIVED
            # What a cut goes to: when the latest packets queued (they arrived at the
            # link's pace, not the sender's), the rate they arrived at is the link's now;
            # the last second's average mixes in the rate before a cap came down, or the
            # pause before a keyframe. Growth stays capped by the last second's.
            carried = (self._recent_received_bps() or received) if queued else received
            if ratio < SEVERE_RATIO:  # the link fell far below what we send: cut at once
                usage = Usage.OVERUSE
            # with no queue in sight, what arrived while the sender sent little measured
            # the sender (module doc of .estimate)
            app_limited = not queued and self._app_limited(before)
            overuse = usage is Usage.OVERUSE
            self._rate.update(
                usage, carried if overuse else received, self.rtt_s, now, app_limited=app_limited
            )
            if overuse:
                self._congested(now, carried, app_limited=app_limited)
            elif queued:
                self._congested_on_trial(now, carried)
            else:
                self._judge_trial(now)
            probed = self.probes.feedback(result.arrivals, result.lost_clusters)
            if probed is not None:
                self._probed(probed, before, now)
        self._count_loss(result.lost, result.reported, now)

    def _congested(self, now: float, received: float | None, *, app_limited: bool) -> None:
        """Overuse now; the caller received ``received`` lately (the link's rate, unless
        ``app_limited``: then the sender's, and the backoff from the estimate stands)."""
        self.probes.congested(now)
        if received is not None and not app_limited:
            self.probes.carried(received, now)
        self._end_trial(now, None if app_limited else received)

    def _congested_on_trial(self, now: float, received: float | None) -> None:
        """The latest packets queued: a lift on trial did not hold."""
        if self._trial is not None:
            self.probes.congested(now)
            self._end_trial(now, received)

    def _end_trial(self, now: float, received: float | None) -> None:
        """Back from a lift that did not hold to :data:`~.estimate.BETA` × what the caller
        got meanwhile, ``received`` (None: where the rate is now), never below where the
        climb began."""
        if self._trial is None:
            return
        before, _, _ = self._trial
        self._trial = None
        rate = self._rate.rate
        measured = rate if received is None else BETA * received
        self._rate.set_rate(max(before, min(rate, measured)), now)

    def _judge_trial(self, now: float) -> None:
        """No congestion now: a lift on trial for :data:`TRIAL_S` holds; until then the
        estimate ramps towards it."""
        trial = self._trial
        if trial is None:
            return
        _, since, lifted = trial
        if now - since >= TRIAL_S:
            self._trial = None
            self.probes.held(self.estimate_bps, now)
        else:  # the ramp towards the lift (module doc), from where this step began
            start = min(self._rate.rate, lifted)
            progress = min(1.0, (now - since) / RAMP_S)
            ramp = start * (lifted / start) ** progress
            self._rate.set_rate(max(self._rate.rate, ramp), now)

    def _recent_received_bps(self) -> float | None:
        """What the last :data:`TRIAL_PACKETS` packets arrived at (bits per second): behind
        a queue, the link's own rate now. None if too few."""
        recent = self._recent
        if len(recent) < TRIAL_PACKETS:
            return None
        last = sorted(a.arrival_s for a in recent)[-TRIAL_PACKETS:]
        sizes = [a.size for a in recent if a.arrival_s >= last[0]][1:]
        span = last[-1] - last[0]
        return None if span <= 0 else 8 * sum(sizes) / span

    def _app_limited(self, estimate_bps: int) -> bool:
        """Whether the last second's packets were sent at under
        :data:`~.estimate.APP_LIMITED` × ``estimate_bps`` (the avatar listening, a pause
        in its speech, the keyframe that ends it): what arrived then says what was sent,
        not what the link carries (``docs/design/link.md`` §19)."""
        latest = self._sent_now
        sent = None if latest is None else self._sent.bps(latest)
        return sent is not None and sent < APP_LIMITED * estimate_bps

    def _arrival_ratio(self) -> float:
        """What the latest packets were delivered at against what they were sent at (1:
        the link kept up; less: they queued, or were lost on the way)."""
        recent = self._recent
        if len(recent) < TRIAL_PACKETS:
            return 1.0
        sent_span = recent[-1].send_s - recent[0].send_s
        arrived_span = max(a.arrival_s for a in recent) - min(a.arrival_s for a in recent)
        if sent_span <= 0 or arrived_span <= 0:
            return 1.0
        arrived = sum(a.size for a in recent)
        lost = sum(size for _, size in self._recent_lost)
        return min(1.0, (arrived / arrived_span) / ((arrived + lost) / sent_span))

    def _probed(self, result_bps: float, before_bps: int, now: float) -> None:
        step = self.probes.step
        self.probes.measured(result_bps, before_bps, now)
        lifted = min(result_bps, step * before_bps)
        if lifted > before_bps:
            base = before_bps if self._trial is None else min(before_bps, self._trial[0])
            self._trial = (base, now, lifted)
            self._remb.lift(lifted)
            self._loss.lift(lifted)

    def remb(self, bps: int, now: float, sent_bps: float) -> None:
        """The caller's REMB, ``sent_bps`` having been sent lately (ignored once
        transport-cc feedback drives the estimate)."""
        self.remb_bps = bps
        if self.mode is Mode.TRANSPORT_CC:
            return
        self.mode = Mode.REMB
        self.measured = True
        before = self._remb.rate
        if self._remb.update(bps, sent_bps, now) < before:
            self.probes.congested(now)

    def report_loss(self, fraction: float, packets: int, now: float) -> None:
        """Loss a receiver report or NACKs say (not counted with transport-cc, whose
        feedback names every packet lost)."""
        if self.mode is Mode.TRANSPORT_CC:
            return
        lost = round(fraction * packets)
        self._count_loss(lost, packets, now)

    def _count_loss(self, lost: int, reported: int, now: float) -> None:
        self._lost += lost
        self._reported += reported
        if self._window_start is None:
            self._window_start = now
        if now - self._window_start < LOSS_WINDOW_S or self._reported < LOSS_WINDOW_PACKETS:
            return
        loss = self._lost / self._reported
        self.last_loss = loss
        self.measured = True
        self._lost = self._reported = 0
        self._window_start = now
        self._loss.update(loss, self.estimate_bps, self.rtt_s, now)
        if loss > LOSS_LOW:
            self.probes.congested(now)
