"""Probing: a short burst above the estimate, to learn whether the link carries more.

A delay-based estimate only grows about 8 % a second on its own, and a caller's REMB no
faster, so after a dip (a train goes into a tunnel, someone else's download ends) a call
would take tens of seconds to get its picture back. A probe asks the link directly
(``docs/design/link.md`` §19): at least :data:`PROBE_PACKETS` packets, over at least
:data:`PROBE_MIN_S`, sent on top of the media so that the link carries one of
:data:`PROBE_FACTORS` × the estimate meanwhile, each stamped with its cluster. When
their feedback is in: if most of them arrived (:data:`MIN_RECEIVED`) as fast as they
were sent, the link carries the media and the probe (the estimate is raised towards
that, by at most :data:`PROBE_STEP` at a time, :data:`STARTUP_FACTOR` in a call's first
climb); if they arrived slower, the link is full (the estimate is not raised).

:class:`ProbePlanner` says when to probe and how much: only when the estimate is below
the call's ceiling, no congestion was seen for :data:`QUIET_S`, and the last probe is
older than the interval. A probe that found the link full, or whose lift did not hold,
doubles the interval and makes the next probe smaller; one that found room resets both,
so a capped link is asked rarely and a freed one quickly. How rarely depends on what the
link carried lately: below :data:`RECOVER_BELOW` × the highest rate it carried within
:data:`BEST_KEEP_S` (a lift that held, or what arrived when it congested: a call at its
ceiling on a link just under it never holds a lift for long), the link dropped and may
come back, and the interval stays under
:data:`RECOVER_INTERVAL_S`; at about that level (a link capped there) it grows to
:data:`MAX_INTERVAL_S`, since each probe on a capped link is a short overload (as
libwebrtc probes again soon after a large drop, and rarely otherwise). A
token bucket (a shaper, a policer) lets a burst through at any rate, so a probe shorter
than its bucket finds room that is not there: a probe lasts at least
:data:`PROBE_MIN_S`, and congestion within :data:`FOOLED_WITHIN_S` of the lift it
caused counts it as failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from streaming.link.feedback import Arrival

PROBE_PACKETS = 8
#: A probe lasts at least this long at its rate (more packets at higher rates).
PROBE_MIN_S = 0.05
PROBE_PACKET_BYTES = 1200
#: Congestion this soon after a probe lifted the estimate means the probe was fooled
#: (a token bucket's burst lets a short probe through at any rate): it counts as failed.
FOOLED_WITHIN_S = 3.0
#: A probe counts only when at least this share of its packets arrived.
MIN_RECEIVED = 0.8
#: Received at under this × the send rate: the link is saturated at the receive rate.
SATURATED_RATIO = 0.9
#: How far above the estimate a probe asks (× the estimate): the first factor, down to
#: the last after each probe that found the link full, back to the first after one that
#: found room; and the first interval.
PROBE_FACTORS = (2.0, 1.5, 1.25)
#: The most a probe lifts the estimate by (× the estimate): a probe a token bucket
#: fooled then costs a short, mild overload, and a freed link is climbed in steps.
PROBE_STEP = 1.5
#: Until the call first meets congestion it is starting: a probe's lift may double the
#: estimate (from its 300 kbit/s start, full rate in four probes).
STARTUP_FACTOR = 2.0
FIRST_INTERVAL_S = 1.0
MAX_INTERVAL_S = 16.0
RECOVER_INTERVAL_S = 3.0
RECOVER_BELOW = 0.7
BEST_KEEP_S = 60.0
#: No probe until the link has been free of congestion (loss, overuse) this long.
QUIET_S = 1.5


@dataclass
class Cluster:
    """One probe's packets, as their feedback comes in."""

    ident: int
    rate_bps: int  # the probe's own packets' rate, on top of the media
    packets: int
    base_bps: int = 0  # the estimate it was sent above (the media's rate meanwhile)
    arrivals: list[Arrival] = field(default_factory=list)
    lost: int = 0

    @property
    def complete(self) -> bool:
        return len(self.arrivals) + self.lost >= self.packets

    def result_bps(self) -> float | None:
        """What the probe measured (module doc), or None if it says nothing."""
        if len(self.arrivals) < max(2, math.ceil(MIN_RECEIVED * self.packets)):
            return None
        ordered = sorted(self.arrivals, key=lambda a: a.send_s)
        send_span = ordered[-1].send_s - ordered[0].send_s
        by_arrival = sorted(self.arrivals, key=lambda a: a.arrival_s)
        receive_span = by_arrival[-1].arrival_s - by_arrival[0].arrival_s
        if send_span <= 0 or receive_span <= 0:
            return None
        # the bytes after the first, over the time from the first to the last: the
        # same bytes both ways (the packets' sizes differ: resent media, then padding)
        sent_bytes = 8 * sum(a.size for a in ordered[1:])
        send_bps = sent_bytes / send_span
        receive_bps = 8 * sum(a.size for a in by_arrival[1:]) / receive_span
        if receive_bps < SATURATED_RATIO * send_bps:
            return None  # the link could not take the probe on top of the media
        return self.base_bps + min(send_bps, receive_bps)


class ProbePlanner:
    """When to probe, and at what rate (module doc)."""

    def __init__(self, ceiling_bps: int) -> None:
        self.ceiling_bps = ceiling_bps
        self._interval = FIRST_INTERVAL_S
        self._interval_before_jump = FIRST_INTERVAL_S
        self._last_probe = -math.inf
        self._last_congestion = -math.inf
        self._next_ident = 1
        self._jumped_at = -math.inf
        self._factor = 0  # index into PROBE_FACTORS
        self._best = (0, -math.inf)  # the highest rate the link carried lately, and when
        self.clusters: dict[int, Cluster] = {}
        self.sent = 0
        self.succeeded = 0

    def congested(self, now: float) -> None:
        """Loss or overuse was seen now."""
        self._last_congestion = now
        if now - self._jumped_at < FOOLED_WITHIN_S:  # the last jump did not hold
            self._jumped_at = -math.inf
            self.succeeded -= 1
            # backed off from the interval before the jump: a link that fools every
            # probe is asked ever more rarely, as one whose probes find it full
            self._interval = min(2 * self._interval_before_jump, MAX_INTERVAL_S)

    @property
    def starting(self) -> bool:
        """Whether no congestion has been seen yet (the call's first climb)."""
        return self._last_congestion == -math.inf

    @property
    def step(self) -> float:
        """The most a probe may lift the estimate by now (× the estimate)."""
        return STARTUP_FACTOR if self.starting else PROBE_STEP

    def due(self, estimate_bps: int, now: float) -> Cluster | None:
        """A probe to send now, or None."""
        if estimate_bps >= 0.95 * self.ceiling_bps or self.clusters:
            return None
        if now - self._last_congestion < QUIET_S or now - self._last_probe < self._wait(
            estimate_bps, now
        ):
            return None
        factor = PROBE_FACTORS[self._factor]
        rate = int(min(self.ceiling_bps, factor * estimate_bps)) - estimate_bps
        packets = max(PROBE_PACKETS, math.ceil(rate * PROBE_MIN_S / (8 * PROBE_PACKET_BYTES)))
        cluster = Cluster(self._next_ident, rate, packets, base_bps=estimate_bps)
        self._next_ident += 1
        self._last_probe = now
        self.clusters[cluster.ident] = cluster
        self.sent += 1
        return cluster

    def held(self, estimate_bps: int, now: float) -> None:
        """The last probe's lift held at ``estimate_bps``: the link had that room; the
        next probe soon."""
        self._jumped_at = -math.inf
        self._interval = FIRST_INTERVAL_S
        self.carried(estimate_bps, now)

    def carried(self, bps: float, now: float) -> None:
        """The link carried ``bps`` now (a lift held; what arrived when it congested):
        until :data:`BEST_KEEP_S` have passed, an estimate far below the highest such
        rate is probed often (module doc)."""
        best, since = self._best
        if bps >= best or now - since > BEST_KEEP_S:
            self._best = (round(bps), now)

    def _wait(self, estimate_bps: int, now: float) -> float:
        """How long after the last probe the next may go (module doc)."""
        best, since = self._best
        if now - since <= BEST_KEEP_S and estimate_bps < RECOVER_BELOW * best:
            return min(self._interval, RECOVER_INTERVAL_S)
        return self._interval

    def abandon(self, ident: int) -> None:
        """A probe that could not be sent (nothing to send it with)."""
        self.clusters.pop(ident, None)

    def feedback(self, arrivals: list[Arrival], lost: dict[int, int]) -> float | None:
        """Feedback on probe packets; the rate a probe that completed measured, if any
        measured more than nothing."""
        for arrival in arrivals:
            cluster = self.clusters.get(arrival.cluster) if arrival.cluster is not None else None
            if cluster is not None:
                cluster.arrivals.append(arrival)
        for ident, count in lost.items():
            if ident in self.clusters:
                self.clusters[ident].lost += count
        best: float | None = None
        for ident, cluster in list(self.clusters.items()):
            if not cluster.complete:
                continue
            del self.clusters[ident]
            result = cluster.result_bps()
            if result is not None and (best is None or result > best):
                best = result
        return best

    def measured(self, result_bps: float | None, estimate_bps: int, now: float) -> None:
        """A probe's result against the estimate it was sent above: found more (the
        next probe comes soon) or not (the interval doubles)."""
        if result_bps is not None and result_bps > 1.1 * estimate_bps:
            self.succeeded += 1
            self._jumped_at = now
            self._factor = 0
            self._interval_before_jump = self._interval
            self._interval = FIRST_INTERVAL_S  # the next step of the climb soon
        else:
            self._factor = min(self._factor + 1, len(PROBE_FACTORS) - 1)
            self._interval = min(2 * self._interval, MAX_INTERVAL_S)

    def expire(self, now: float, timeout_s: float = 2.0) -> None:
        """Forget probes whose feedback never came (the caller sends none, or it was lost)."""
        if self.clusters and now - self._last_probe > timeout_s:
            self.clusters.clear()
            self._interval = min(2 * self._interval, MAX_INTERVAL_S)
