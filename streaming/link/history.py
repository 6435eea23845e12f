"""The video packets a call sent lately, for the caller's NACKs and for probes.

aiortc keeps the last 128 packets: half a second of 720p at 2.5 Mbit/s, less than one
round trip once a queue builds, so a NACK for an IDR's packet often came too late. Here
the history is kept by time (:data:`KEEP_S`, bounded by :data:`MAX_PACKETS`), and a
packet NACKed again within a round trip of its last resend is not resent again (the
first resend is still on its way). What is resent is limited to the call's estimate
over :data:`BUDGET_WINDOW_S`: a lossy link is not flooded by its own repairs.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque

KEEP_S = 1.5
MAX_PACKETS = 4096
BUDGET_WINDOW_S = 1.0


class SendHistory:
    """Sent video packets by RTP sequence number (plaintext, as sent)."""

    def __init__(self) -> None:
        self._packets: OrderedDict[int, tuple[float, bytes]] = OrderedDict()
        self._oldest_at = float("-inf")  # when the oldest kept was sent (a lower bound)
        self._resent_at: dict[int, float] = {}
        self._resends: deque[tuple[float, int]] = deque()
        self._resent_bytes = 0
        self.resent = 0
        self.refused = 0  # NACKed but gone, resent too recently, or over budget

    def add(self, sequence: int, data: bytes, now: float) -> None:
        packets = self._packets
        if sequence in packets:  # its number came round again (65,536 packets on)
            del packets[sequence]
        packets[sequence] = (now, data)
        if self._oldest_at >= now - KEEP_S and len(packets) <= MAX_PACKETS:
            return  # nothing to let go yet: the common case, no look at the oldest
        while packets:
            oldest, (sent_at, _) = next(iter(packets.items()))
            if len(packets) <= MAX_PACKETS and sent_at >= now - KEEP_S:
                self._oldest_at = sent_at
                break
            del packets[oldest]
            self._resent_at.pop(oldest, None)

    def for_resend(
        self, sequence: int, now: float, rtt_s: float, budget_bps: float
    ) -> bytes | None:
        """Packet ``sequence`` to resend now, or None (module doc)."""
        entry = self._packets.get(sequence)
        last = self._resent_at.get(sequence)
        while self._resends and self._resends[0][0] < now - BUDGET_WINDOW_S:
            self._resent_bytes -= self._resends.popleft()[1]
        if (
            entry is None
            or (last is not None and now - last < rtt_s)
            or 8 * (self._resent_bytes + len(entry[1])) > budget_bps * BUDGET_WINDOW_S
        ):
            self.refused += 1
            return None
        self._resent_at[sequence] = now
        self._resends.append((now, len(entry[1])))
        self._resent_bytes += len(entry[1])
        self.resent += 1
        return entry[1]

    def latest(self, count: int) -> list[bytes]:
        """The last ``count`` packets sent, oldest first (what a probe resends)."""
        latest = [data for _, data in itertools.islice(reversed(self._packets.values()), count)]
        return latest[::-1]

    def __len__(self) -> int:
        return len(self._packets)
