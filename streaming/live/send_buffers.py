"""Media a session has made ahead of time, waiting for its send slot.

Composed video frames (by frame index) and Opus packets (by 20 ms chunk index) are made
up to one session delay before the tracks send them (``docs/design/audio-in.md`` §2,
``docs/design/delay.md`` §8). Each slot is handed out once, when its track asks for it;
anything older than the slot asked for is no longer wanted and goes. A track that is
never pulled (a caller that did not negotiate it) takes nothing, so every chunk made
also prunes both buffers to the delay plus :data:`STALE_SLOTS` slots: they stay bounded
whatever the tracks do.

Not thread-safe: the event loop alone uses it.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import av
import numpy as np

from streaming.audio_rates import AUDIO_CHUNK_S
from streaming.webrtc.tracks import SILENCE, stamped

STALE_SLOTS = 50  # slots kept past their send time before a buffer drops them
#: Chunks taken by the session's own track, kept for viewers whose slot runs just after.
TAKEN_KEPT = 4


class Waiting(NamedTuple):
    """How much is made and waiting for its slot."""

    audio_chunks: int
    frames: int


class SendBuffers:
    """Composed frames and Opus packets of one session, until their slots take them."""

    def __init__(self, delay_s: float, fps: int) -> None:
        self._fps = fps
        self._keep_chunks = round(delay_s / AUDIO_CHUNK_S) + STALE_SLOTS
        self._frames: dict[int, np.ndarray] = {}
        self._chunks: dict[int, av.Packet[Any]] = {}
        # The last frame slot handed out (an existing int: nothing allocated per frame).
        self._last_frame_taken = -1
        self._taken: deque[tuple[int, av.Packet[Any]]] = deque(maxlen=TAKEN_KEPT)

    # -- audio ----------------------------------------------------------------------

    def put_chunk(self, index: int, packet: av.Packet[Any]) -> None:
        """Keep chunk ``index`` until its slot; prune both buffers (a track may never pull)."""
        self._chunks[index] = packet
        oldest_chunk = index - self._keep_chunks
        for stale in [i for i in self._chunks if i < oldest_chunk]:
            del self._chunks[stale]
        oldest_frame = int(oldest_chunk * AUDIO_CHUNK_S * self._fps)
        for stale in [i for i in self._frames if i < oldest_frame]:
            del self._frames[stale]

    def holds_chunk(self, index: int) -> bool:
        """Whether chunk ``index``'s packet was made and waits for its slot (else its slot
        sends silence: the chunk was made too late, or not at all)."""
        return index in self._chunks

    def silent_until(self, first: int, last: int) -> int:
        """The last chunk in ``first..last`` up to which every chunk is made and is the
        silence frame (``first - 1`` if ``first`` is not): they will be sent as made."""
        chunks = self._chunks
        for index in range(first, last + 1):
            packet = chunks.get(index)
            if packet is None or bytes(packet) != SILENCE:
                return index - 1
        return last

    def take_chunk(self, index: int) -> av.Packet[Any]:
        """The packet for audio slot ``index`` (silence if none was made); older ones go."""
        for stale in [i for i in self._chunks if i < index]:
            del self._chunks[stale]
        packet = self._chunks.pop(index, None)
        if packet is None:
            packet = stamped(SILENCE, index)
        self._taken.append((index, packet))
        return packet

    def chunk_for_viewer(self, index: int) -> av.Packet[Any]:
        """The packet the session sends (or sent, just now) for audio slot ``index``,
        left in place: what a viewer of the session is sent (silence if there is none)."""
        packet = self._chunks.get(index)
        if packet is not None:
            return packet
        for taken, packet in self._taken:
            if taken == index:
                return packet
        return stamped(SILENCE, index)

    # -- video ----------------------------------------------------------------------

    def put_frame(self, index: int, frame: np.ndarray) -> bool:
        """Keep frame ``index`` until its slot; False (not kept) if that slot was taken."""
        if index <= self._last_frame_taken:
            return False
        self._frames[index] = frame
        return True

    def take_frame(self, index: int) -> np.ndarray | None:
        """The composed frame for video slot ``index``, if there is one; older ones go."""
        self._last_frame_taken = index
        for stale in [i for i in self._frames if i < index]:
            del self._frames[stale]
        return self._frames.pop(index, None)

    # -- both -----------------------------------------------------------------------

    def interrupt(self) -> None:
        """What the caller has not seen or heard yet: frames go, packets turn to silence."""
        self._frames.clear()
        for index in self._chunks:
            self._chunks[index] = stamped(SILENCE, index)

    def sizes(self) -> Waiting:
        """How many packets and frames are waiting."""
        return Waiting(audio_chunks=len(self._chunks), frames=len(self._frames))
