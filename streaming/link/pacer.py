"""The pacer: a call's video packets spread out instead of leaving as one burst.

An encoder hands over a whole frame at once; sent back to back, an IDR's fifty packets
hit the bottleneck together, and a shallow policer or a short queue drops the tail
(``docs/design/link.md`` §19). Like libwebrtc's, this pacer lets video leave at
:data:`PACING_FACTOR` × the video target: a frame of the target's average size takes
``1 / PACING_FACTOR`` of a frame interval, an IDR a few intervals.

It is a leaky bucket kept as one number, the time the link would have finished sending
everything handed to it at the pacing rate: a packet leaves at once while that time is
less than :data:`BURST_S` ahead of now, else it waits until it is. The wait happens in
the video sender's own send loop (it awaits the send), so nothing is queued here and no
task or timer is added per packet; a frame waits at most :data:`MAX_WAIT_S` (beyond
that the rate is raised for the backlog, as libwebrtc caps its queue), and a sender that
falls a slot behind skips frames (``webrtc/pacing.py``) rather than queueing them.
Audio never waits; retransmissions and probes leave at once but count against the
budget, so the media after them waits for the link instead.
"""

from __future__ import annotations

#: Video leaves at this × the video target (libwebrtc's pacing factor).
PACING_FACTOR = 2.5
#: Packets within this much of the budget leave at once (libwebrtc processes every 5 ms).
BURST_S = 0.005
#: The longest a video packet waits; past it the backlog is sent faster.
MAX_WAIT_S = 0.25


class Pacer:
    """When each video packet may leave (module doc). Times are seconds, passed in."""

    def __init__(self, target_bps: int, factor: float = PACING_FACTOR) -> None:
        self._factor = factor
        self.rate_bps = max(1.0, factor * target_bps)
        self._busy_until = 0.0  # when the link would have sent everything so far
        self.waits = 0  # packets that waited
        self.waited_s = 0.0

    def set_target(self, target_bps: int) -> None:
        """A new video target: the pacing rate follows it."""
        self.rate_bps = max(1.0, self._factor * target_bps)

    def wait_s(self, size: int, now: float) -> float:
        """How long a video packet of ``size`` bytes handed over ``now`` waits."""
        start = max(self._busy_until, now)
        wait = start - now - BURST_S
        if wait > MAX_WAIT_S:  # a backlog this long: the link sees it sooner or never
            start, wait = now + MAX_WAIT_S + BURST_S, MAX_WAIT_S
        self._busy_until = start + 8 * size / self.rate_bps
        if wait <= 0:
            return 0.0
        self.waits += 1
        self.waited_s += wait
        return wait

    def spend(self, size: int, now: float) -> None:
        """``size`` bytes sent outside the pacing (a retransmission, a probe)."""
        self._busy_until = max(self._busy_until, now) + 8 * size / self.rate_bps

    def backlog_s(self, now: float) -> float:
        """How far ahead of now the budget is (0 when the link is idle)."""
        return max(0.0, self._busy_until - now)
