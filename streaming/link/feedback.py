"""What we sent, and what the caller's transport-cc feedback says became of it.

Every packet a call sends carries a transport-wide sequence number
(:mod:`.rtp_bytes`); :class:`SentPackets` remembers, for the last few thousand, when it
left, its size and the probe cluster it belonged to. A feedback message names, for a
run of those numbers, when each arrived or that it did not;
:meth:`SentPackets.resolve` pairs the two into :class:`Arrival` records, each reported
once, in send order, and counts the ones lost. :class:`RateWindow` keeps bytes over a
sliding window: what the caller received (the delay-based decrease's reference) or what
we sent. Sequence numbers wrap at 2^16; they are unwrapped against the last one seen.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from streaming.link.rtcp_bytes import TransportFeedback

#: Sent packets remembered for feedback: several seconds of a call's packets.
SENT_HISTORY = 4096


@dataclass(frozen=True, slots=True)
class Sent:
    send_s: float
    size: int
    cluster: int | None  # the probe cluster it belonged to


@dataclass(frozen=True, slots=True)
class Arrival:
    """A packet the caller received: when we sent it, when it arrived (its clock)."""

    sequence: int  # unwrapped
    send_s: float
    arrival_s: float
    size: int
    cluster: int | None


@dataclass(frozen=True, slots=True)
class FeedbackResult:
    """One feedback message's news: packets received (send order) and lost."""

    arrivals: list[Arrival]
    lost: int
    lost_clusters: dict[int, int]  # probe cluster → its packets lost
    lost_sent: list[tuple[float, int]] = field(default_factory=list)  # (send time, size)

    @property
    def reported(self) -> int:
        return len(self.arrivals) + self.lost


def _unwrap(sequence: int, reference: int) -> int:
    """``sequence`` (16 bits) as the unwrapped number nearest ``reference``."""
    candidate = (reference & ~0xFFFF) | sequence
    if candidate - reference > 0x8000:
        candidate -= 0x10000
    elif reference - candidate > 0x8000:
        candidate += 0x10000
    return candidate


class SentPackets:
    """The call's recently sent packets by transport-wide sequence number."""

    def __init__(self) -> None:
        self._sent: OrderedDict[int, Sent] = OrderedDict()
        self._next = 0  # unwrapped number of the next packet
        self._reported: set[int] = set()  # reported since they were sent (once each)

    def next_sequence(self) -> int:
        """The 16-bit number the next packet carries."""
        return self._next & 0xFFFF

    def sent(self, send_s: float, size: int, cluster: int | None = None) -> int:
        """Record the packet numbered :meth:`next_sequence` as sent; returns that number."""
        number = self._next
        self._next += 1
        self._sent[number] = Sent(send_s, size, cluster)
        while len(self._sent) > SENT_HISTORY:
            old, _ = self._sent.popitem(last=False)
            self._reported.discard(old)
        return number & 0xFFFF

    def resolve(self, feedback: TransportFeedback) -> FeedbackResult:
        """The packets ``feedback`` reports on that were not reported before."""
        base = _unwrap(feedback.base_sequence, self._next - 1)
        arrivals: list[Arrival] = []
        lost = 0
        lost_clusters: dict[int, int] = {}
        lost_sent: list[tuple[float, int]] = []
        for offset, arrival in enumerate(feedback.arrivals):
            number = base + offset
            sent = self._sent.get(number)
            if sent is None or number in self._reported:
                continue
            if arrival is None:
                # Not received *yet*: a later message may still report it; counted lost
                # only if no later message does (see forget_unreported).
                continue
            self._reported.add(number)
            arrivals.append(Arrival(number, sent.send_s, arrival, sent.size, sent.cluster))
        # Numbers before the last one received that no message reported are lost.
        if arrivals:
            last = arrivals[-1].sequence
            for offset, arrival in enumerate(feedback.arrivals):
                number = base + offset
                if number >= last or arrival is not None or number in self._reported:
                    continue
                sent = self._sent.get(number)
                if sent is None:
                    continue
                self._reported.add(number)
                lost += 1
                lost_sent.append((sent.send_s, sent.size))
                if sent.cluster is not None:
                    lost_clusters[sent.cluster] = lost_clusters.get(sent.cluster, 0) + 1
        arrivals.sort(key=lambda a: a.sequence)
        return FeedbackResult(arrivals, lost, lost_clusters, lost_sent)


class RateWindow:
    """Bytes over the last ``window_s`` seconds, as bits per second."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._entries: deque[tuple[float, int]] = deque()
        self._bytes = 0

    def add(self, now: float, size: int) -> None:
        self._entries.append((now, size))
        self._bytes += size
        self._expire(now)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries and entries[0][0] < now - self.window_s:
            self._bytes -= entries.popleft()[1]

    def bps(self, now: float) -> float | None:
        """The rate over the window (None until it holds a window's worth of time)."""
        self._expire(now)
        if not self._entries:
            return 0.0
        span = now - self._entries[0][0]
        if span < self.window_s / 2:
            return None
        return 8 * self._bytes / max(span, self.window_s / 2)
