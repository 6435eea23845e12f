"""One bandwidth estimate per call, from delay, loss and what the caller says.

``docs/design/link.md`` §19 explains the whole controller; this module turns what the
caller's feedback says into one number, the bits per second the call may send:

- **delay** — with transport-cc feedback, our own detector (:mod:`.delay_based`) drives
  :class:`RateControl`: on overuse the rate drops to :data:`BETA` × what the caller
  received (the link's real throughput), held until the queue has drained; otherwise it
  grows, :data:`MULTIPLICATIVE_GROWTH` a second while the link's capacity is unknown,
  about one packet per round trip once near the capacity last measured (GCC's AIMD).
  A sender that was application-limited (it sent under :data:`APP_LIMITED` × the
  estimate: the avatar listened, a pause in its speech) says nothing about the link by
  what arrived, so its overuse backs off from the estimate instead, :data:`BETA` × at
  most once per response time: an overuse as a pause ended cut a 2.7 Mbit/s estimate
  to 0.85 × the 1.07 Mbit/s of the pause (``docs/design/link.md`` §19);
- **REMB** — a caller that sends only REMB (no transport-cc) runs the same detector on
  its side; its value is followed when it drops (that is its overuse), when it stays
  under what we send, and when it is above ours; otherwise our estimate keeps what it
  was, so a listening call's small stream does not pull the estimate down to what it
  uses;
- **loss** — the fraction lost (receiver reports, transport-cc, NACKs): above
  :data:`LOSS_HIGH` the rate is cut by half the loss, at most once per
  :data:`LOSS_DECREASE_INTERVAL_S` plus a round trip; below :data:`LOSS_LOW` it may
  grow :data:`MULTIPLICATIVE_GROWTH` a second; in between it holds (random loss that
  NACKs repair must not shrink the picture);
- **probes** — a cluster of padding sent above the estimate, whose arrival rate says the
  link carries more (:mod:`.probes`), lifts both at once: how the estimate climbs back
  within seconds after a dip instead of 8 % a second.

The estimate is the lower of the delay-based (or REMB) rate and the loss-based rate,
within [``min_bps``, ``max_bps``]. Times are seconds on one monotonic clock, passed in.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from streaming.link.delay_based import Usage

#: On overuse, the rate becomes this × what the caller received.
BETA = 0.85
#: Sending under this × the estimate is application-limited (libwebrtc's ALR detector's
#: bandwidth usage ratio): what arrives then is what was sent, not what the link carries.
APP_LIMITED = 0.65
#: Growth a second while the link's capacity is unknown (and the loss-based rate's).
MULTIPLICATIVE_GROWTH = 1.08
#: Growth is capped at this × the received rate (+10 kbit/s): no promise the link kept
#: (GCC allows 1.5×; an encoder that undershoots its target then lets the estimate float
#: far above what was ever sent, and the next burst meets a full queue).
THROUGHPUT_HEADROOM = 1.25
#: Loss below LOW lets the loss-based rate grow; above HIGH it cuts; between, it holds.
LOSS_LOW, LOSS_HIGH = 0.02, 0.10
LOSS_DECREASE_INTERVAL_S = 0.3
#: A REMB this much below the last one is the caller's overuse (it sends drops at once);
#: one under REMB_BELOW_SENT × what we send for REMB_BELOW_SENT_S is followed too.
REMB_DROP = 0.97
REMB_BELOW_SENT = 0.9
REMB_BELOW_SENT_S = 1.0
#: Near the capacity last measured the rate grows by half a packet per response time
#: (a round trip plus RESPONSE_S): about 14 kbit/s a second at a 50 ms round trip.
#: GCC's whole packet per round trip + 100 ms refilled a 300 kbit/s link's queue every
#: few seconds (docs/performance/networks.md).
PACKET_BITS = 600 * 8
RESPONSE_S = 0.3


class RateState(enum.Enum):
    HOLD = "hold"
    INCREASE = "increase"
    DECREASE = "decrease"


@dataclass(frozen=True)
class RateLimits:
    """Where a call's estimate starts and the range it stays in (bits per second)."""

    min_bps: int
    max_bps: int
    start_bps: int

    def clamp(self, bps: float) -> int:
        return int(min(max(bps, self.min_bps), self.max_bps))


class RateControl:
    """GCC's additive-increase, multiplicative-decrease rate for a delay signal."""

    def __init__(self, limits: RateLimits) -> None:
        self._limits = limits
        self.rate = float(limits.start_bps)
        self.state = RateState.INCREASE
        self._capacity: float | None = None  # throughput at the last overuse (mean)
        self._capacity_var = 0.4  # its variance over its mean, in kbit/s (GCC's units)
        self._last_update: float | None = None
        self._last_backoff = -math.inf  # the last application-limited backoff

    @property
    def bps(self) -> int:
        return self._limits.clamp(self.rate)

    def set_rate(self, bps: float, now: float) -> None:
        """A measured rate (a probe's) replaces the estimate."""
        self.rate = float(self._limits.clamp(bps))
        self._last_update = now

    def update(
        self,
        usage: Usage,
        received_bps: float | None,
        rtt_s: float,
        now: float,
        *,
        app_limited: bool = False,
    ) -> int:
        """The rate after the detector said ``usage``, the caller having received
        ``received_bps`` lately (None: not known yet); ``app_limited``: the sender sent
        well under the rate meanwhile (module doc)."""
        last, self._last_update = self._last_update, now
        elapsed = 0.0 if last is None else min(max(now - last, 0.0), 1.0)
        if usage is Usage.OVERUSE:
            self.state = RateState.DECREASE
        elif usage is Usage.UNDERUSE:
            self.state = RateState.HOLD
        elif self.state is RateState.HOLD:  # the queue drained: grow again
            self.state = RateState.INCREASE
        if self.state is RateState.DECREASE and app_limited:
            if now - self._last_backoff >= rtt_s + RESPONSE_S:
                self.rate *= BETA  # from the estimate: what arrived measured the sender
                self._last_backoff = now
            self.state = RateState.HOLD
        elif self.state is RateState.DECREASE:
            self._decrease(received_bps)
        elif self.state is RateState.INCREASE:
            self._increase(received_bps, rtt_s, elapsed)
        self.rate = float(self._limits.clamp(self.rate))
        return self.bps

    def _decrease(self, received_bps: float | None) -> None:
        if received_bps is not None and received_bps > 0:
            self.rate = min(self.rate, BETA * received_bps)
            self._learn_capacity(received_bps)
        else:
            self.rate *= BETA
        self.state = RateState.HOLD

    def _increase(self, received_bps: float | None, rtt_s: float, elapsed: float) -> None:
        before = self.rate
        capacity = self._capacity
        if capacity is not None and received_bps is not None:
            spread = 1000 * math.sqrt(self._capacity_var * capacity / 1000)
            if received_bps > capacity + 3 * spread:
                self._capacity = None  # beyond what we knew: grow fast again
        if self._capacity is not None:
            response_s = rtt_s + RESPONSE_S
            self.rate += max(PACKET_BITS / response_s * elapsed, 0.0)
        else:
            self.rate *= MULTIPLICATIVE_GROWTH**elapsed
        if received_bps is not None:
            self.rate = min(self.rate, max(THROUGHPUT_HEADROOM * received_bps + 10_000, before))

    def _learn_capacity(self, received_bps: float) -> None:
        received = received_bps / 1000  # kbit/s, the units GCC's variance bounds are in
        if self._capacity is None:
            self._capacity = received_bps
            return
        mean = self._capacity / 1000
        updated = 0.95 * mean + 0.05 * received
        self._capacity = 1000 * updated
        variance = 0.95 * self._capacity_var + 0.05 * (received - mean) ** 2 / max(updated, 1.0)
        self._capacity_var = min(max(variance, 0.4), 2.5)


class LossBasedRate:
    """The loss-based rate: cut by half the loss above :data:`LOSS_HIGH`, held between,
    grown below :data:`LOSS_LOW` (GCC's loss controller)."""

    def __init__(self, limits: RateLimits) -> None:
        self._limits = limits
        self.rate = float(limits.max_bps)
        self._last_decrease = -math.inf
        self._last_update: float | None = None
        self.loss = 0.0

    @property
    def bps(self) -> int:
        return self._limits.clamp(self.rate)

    def update(self, loss: float, current_bps: int, rtt_s: float, now: float) -> int:
        """The rate after a window with ``loss`` lost, the call's estimate being
        ``current_bps``."""
        last, self._last_update = self._last_update, now
        elapsed = 0.0 if last is None else min(max(now - last, 0.0), 1.0)
        self.loss = loss
        if loss > LOSS_HIGH:
            if now - self._last_decrease >= LOSS_DECREASE_INTERVAL_S + rtt_s:
                self.rate = min(self.rate, current_bps * (1 - 0.5 * loss))
                self._last_decrease = now
        elif loss < LOSS_LOW:
            self.rate = max(self.rate, 0.0) * MULTIPLICATIVE_GROWTH**elapsed + 1000 * elapsed
        self.rate = float(self._limits.clamp(self.rate))
        return self.bps

    def lift(self, bps: float) -> None:
        """A probe measured ``bps`` arriving: the loss-based rate is at least that."""
        self.rate = max(self.rate, float(self._limits.clamp(bps)))


class RembRate:
    """The rate a REMB-only caller allows (module doc).

    A REMB is the caller's own delay-based estimate, and it lags: it grows at most 1.5 ×
    what it receives, so while a listening call sends a small idle loop its REMB says
    little about the link. So it is followed down only when it says so clearly: when it
    drops (the caller saw its queue grow: it sends drops at once), or when it has stayed
    under what we send for :data:`REMB_BELOW_SENT_S`. A value above ours is taken; the
    rate starts at the call's full rate, as a caller with no REMB would get.
    """

    def __init__(self, limits: RateLimits) -> None:
        self._limits = limits
        self.rate = limits.max_bps
        self.last: int | None = None
        self._below_since: float | None = None

    def update(self, remb_bps: int, sent_bps: float, now: float) -> int:
        """The rate after a REMB of ``remb_bps``, ``sent_bps`` having been sent lately."""
        previous, self.last = self.last, remb_bps
        if remb_bps < REMB_BELOW_SENT * sent_bps:
            if self._below_since is None:
                self._below_since = now
        else:
            self._below_since = None
        insisted = self._below_since is not None and now - self._below_since >= REMB_BELOW_SENT_S
        if (previous is not None and remb_bps < REMB_DROP * previous) or insisted:
            self.rate = min(self.rate, remb_bps)
        elif remb_bps > self.rate:
            self.rate = remb_bps
        self.rate = self._limits.clamp(self.rate)
        return self.rate

    def lift(self, bps: float) -> None:
        self.rate = max(self.rate, self._limits.clamp(bps))
