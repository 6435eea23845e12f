"""A caller's audio packets go on to the decoder as they arrive, not after a prefetch.

aiortc's receiver puts audio through a jitter buffer that releases packet ``k`` only once
packet ``k + 4`` is in (80 ms of delay on every call), and after one lost packet waits
until its 16 slots overflow and then stays full, releasing one packet per arrival: a
single loss adds about 220 ms for the rest of the call. A live call needs neither. The
session's mixer absorbs jitter itself (``docs/architecture.md`` §2): a packet that comes
late leaves its tick short, the buffer rises by that much when it arrives, and slack
that is not needed is skipped again. So :class:`ArrivalOrderAudioBuffer` hands every
packet on at once; one older than a packet already handed on (reordered or repeated) is
dropped, its 20 ms lost rather than played out of order.

It stands in for aiortc's buffer through ``streaming.webrtc.compat``
(:func:`~streaming.webrtc.compat.install_audio_receive_buffer`), with the same
``add(packet) -> (pli, frame)`` contract.
"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

#: Sequence numbers are 16 bits; a packet at most half the range behind is "older".
_HALF_RANGE = 0x8000


class ArrivalOrderAudioBuffer:
    """Passes each audio packet on as it arrives; drops one that comes after a later one."""

    def __init__(self) -> None:
        self._last: int | None = None  # sequence number handed on last
        self.passed = 0
        self.dropped = 0  # reordered or repeated packets

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """The frame to decode for ``packet`` (its depayloaded data), or None to drop it.

        The first item is aiortc's "ask for a key frame" flag: never, for audio.
        """
        sequence = packet.sequence_number
        if self._last is not None:
            ahead = (sequence - self._last) % 0x10000
            if ahead == 0 or ahead >= _HALF_RANGE:  # repeated, or behind one handed on
                self.dropped += 1
                return False, None
        data = getattr(packet, "_data", None)
        if data is None:
            raise RuntimeError(
                "aiortc no longer puts the depayloaded audio in RtpPacket._data: "
                "streaming.webrtc.compat and streaming.webrtc.audio_receive must be updated"
            )
        self._last = sequence
        self.passed += 1
        return False, JitterFrame(data=data, timestamp=packet.timestamp)
