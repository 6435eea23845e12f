"""Opus DTX for the avatar's silence: two audio packets per 400 ms instead of twenty.

While the avatar listens its audio is digital silence, and the timeline already sends
it as one small Opus frame (:data:`~streaming.webrtc.tracks.SILENCE`) every 20 ms: 50
packets a second that the server protects and sends and the caller receives, for
nothing. Discontinuous transmission (DTX, RFC 7587 §3.1.3) sends none of them. A caller
asks for it with ``usedtx=1`` on its offer's Opus format (``lipstream.js`` does, and so
can any WebRTC app); the server then sends its silence the way libwebrtc's Opus encoder
does, which is what every browser's receiver expects:

- the first silent chunk after sound goes out as it is (the encoder's decay is over);
- the next one as a TOC byte alone (a 1-byte packet: the receiver plays comfort noise,
  here silence, and counts nothing as lost);
- then nothing, except every :data:`UPDATE_SLOTS` slots (400 ms) the silence frame and
  a TOC byte again, as libopus's comfort-noise update, which keeps the receiver's jitter
  buffer fed and its statistics alive;
- the first chunk with sound goes out at once, on its own slot: sequence numbers go on
  by one, the RTP timestamp jumps over the silence (``docs/design/webrtc.md`` §6).

:class:`OpusDtx` decides per slot; :class:`~streaming.webrtc.tracks.AvatarAudioTrack`
sleeps through the slots it would send nothing for, so a listening call's audio track
wakes twice per 400 ms instead of twenty times.
"""

from __future__ import annotations

#: libopus sends a comfort-noise update after this many DTX frames (20 ms each).
UPDATE_SLOTS = 20


def dtx_frame(silence: bytes) -> bytes:
    """The 1-byte DTX packet for a stream whose silence frame is ``silence``: its TOC
    byte (mode, bandwidth, frame size) with frame-count code 0, and no frame data."""
    return bytes([silence[0] & 0xFC])


class OpusDtx:
    """Which silent audio slots a DTX call sends, and what (module doc).

    ``silence`` is the Opus frame digital silence is sent as; a chunk is silent when its
    payload is exactly that frame.
    """

    def __init__(self, silence: bytes) -> None:
        self._silence = silence
        self._dtx = dtx_frame(silence)
        self._at_rest = False  # the last chunk sent was the silence frame itself
        self._since: int | None = None  # the slot of the DTX frame that began the pause

    @property
    def pausing(self) -> bool:
        """Whether the stream is in a DTX pause (sending only its updates)."""
        return self._since is not None

    def payload(self, index: int, payload: bytes) -> bytes | None:
        """What slot ``index`` sends for its chunk ``payload``: the chunk, the 1-byte DTX
        frame, or nothing (None)."""
        if payload != self._silence:
            self._at_rest = False
            self._since = None
            return payload
        if self._since is None:
            if not self._at_rest:
                self._at_rest = True
                return payload
            self._since = index
            return self._dtx
        offset = (index - self._since) % UPDATE_SLOTS
        if offset == 0:
            return self._dtx
        if offset == UPDATE_SLOTS - 1:
            return payload  # libopus's update: a real frame, of silence
        return None

    def next_send(self, index: int) -> int:
        """After slot ``index`` sent nothing: the next slot that sends something if the
        silence goes on (its update)."""
        if self._since is None:
            return index + 1
        offset = (index - self._since) % UPDATE_SLOTS
        return index + max(1, UPDATE_SLOTS - 1 - offset)
