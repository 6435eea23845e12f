"""Outbound WebRTC tracks paced by one session clock, so lips and sound stay together.

Video frame ``n`` (the face for audio time ``n/fps``) and audio chunk ``m`` (audio time
``m·20 ms``) are both handed to aiortc at ``start + delay + their audio time``. A track
that falls behind skips to the current slot instead of sleeping negative times, so
lateness never turns into growing latency.

Both tracks hand aiortc what it can send with the least work on the event loop: video
frames wrap the composed yuv420p array without a copy, and audio chunks arrive as Opus
packets, encoded off the loop when the session's timeline makes them (aiortc would
otherwise hop to a thread per 20 ms chunk to encode it and compute an RFC 6465 audio
level sample by sample in Python).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

# Re-exported (``as``) for the modules that still import the rates from here; they live
# in streaming.audio_rates.
from streaming.audio_rates import AUDIO_CHUNK_S as AUDIO_CHUNK_S
from streaming.audio_rates import CHUNK_SAMPLES as CHUNK_SAMPLES
from streaming.audio_rates import OUT_RATE as OUT_RATE

logger = logging.getLogger(__name__)

VIDEO_CLOCK = 90_000
# Lateness a track makes up by sending at once; beyond it, missed slots are skipped.
CATCH_UP_S = 0.1
#: Opus bitrate of the outgoing voice (mono, 20 ms frames): transparent for speech.
OPUS_BITRATE = 48_000


class SessionClock:
    """Wall-clock schedule of a session's media: starts when the first track asks."""

    def __init__(self, delay_s: float, on_start: Callable[[float], None]) -> None:
        self.delay_s = delay_s
        self.start: float | None = None
        self._on_start = on_start

    def started(self) -> float:
        """The start time, starting the clock (and the session's timeline) if needed."""
        if self.start is None:
            self.start = time.monotonic()
            self._on_start(self.start)
        return self.start

    def due(self, audio_time_s: float) -> float:
        """When media for ``audio_time_s`` on the session timeline is handed to aiortc."""
        return self.started() + self.delay_s + audio_time_s


async def _wait_for_slot(clock: SessionClock, index: int, period_s: float) -> tuple[int, int]:
    """Sleep until slot ``index`` is due; if it is long overdue, jump to the current slot.

    A slot up to :data:`CATCH_UP_S` late is sent at once (the following ones are then
    early again: due times are absolute, so small stalls do not accumulate); later than
    that, the missed slots are skipped. Returns the slot to send and how many were skipped.
    """
    due = clock.due(index * period_s)
    now = time.monotonic()
    if now < due:
        await asyncio.sleep(due - now)
        return index, 0
    if now - due <= CATCH_UP_S:
        return index, 0
    late_slots = math.floor((now - due) / period_s)
    if logger.isEnabledFor(logging.DEBUG):
        late_ms = (now - due) * 1000
        logger.debug("late by %.0f ms at slot %d: skipping %d", late_ms, index, late_slots)
    return index + late_slots, late_slots


#: Frame ``n`` of the video: a yuv420p array, or a packet already encoded (see
#: :meth:`~streaming.webrtc.video_encoder.LipstreamH264Encoder.encode_packet`).
FrameSource = Callable[[int], Awaitable["np.ndarray | av.Packet[Any]"]]


def video_frame(image: np.ndarray, index: int, fps: int) -> av.VideoFrame:
    """Frame ``index`` of a ``fps`` stream around a yuv420p ``image``, without a copy.

    No copy is needed: composed frames are fresh arrays and cached backgrounds are
    read-only, so nothing writes to the buffer while an encoder reads it.
    """
    frame = av.VideoFrame.from_numpy_buffer(np.ascontiguousarray(image), format="yuv420p")
    frame.pts = index * VIDEO_CLOCK // fps
    frame.time_base = _VIDEO_TIME_BASE
    return frame


_VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK)


class AvatarVideoTrack(MediaStreamTrack):
    """The avatar video: frame ``n`` comes from ``source(n)``.

    An array is handed to aiortc as a frame for it to encode; a packet (H.264 encoded
    off the loop with the sender's own encoder) is handed on as is, and aiortc only
    sends its payloads. :meth:`send_from` switches the source once the codec is known.
    Each of ``sent_listeners`` is called with ``n`` once frame ``n`` is handed to aiortc.
    """

    kind = "video"

    def __init__(
        self,
        clock: SessionClock,
        fps: int,
        source: FrameSource,
        on_sent: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._fps = fps
        self._source = source
        self.sent_listeners: list[Callable[[int], None]] = [] if on_sent is None else [on_sent]
        self._next = 0
        self.frames_sent = 0
        self.frames_skipped = 0

    def send_from(self, source: FrameSource) -> None:
        """Take the next frames from ``source`` (before media flows)."""
        self._source = source

    @property
    def next_index(self) -> int:
        """The next frame this track will send (earlier frames are no longer wanted)."""
        return self._next

    async def recv(self) -> av.VideoFrame | av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        index, skipped = await _wait_for_slot(self._clock, self._next, 1.0 / self._fps)
        self.frames_skipped += skipped
        self._next = index + 1
        media = await self._source(index)
        self.frames_sent += 1
        for listener in self.sent_listeners:
            listener(index)
        if isinstance(media, av.Packet):
            return media  # aiortc sends a packet's payloads as they are
        return video_frame(media, index, self._fps)


PacketSource = Callable[[int], "av.Packet[Any]"]


class OpusChunkEncoder:
    """Encodes 20 ms float32 mono chunks at 48 kHz to Opus, one packet per chunk.

    Packets are stamped with their chunk's place on the timeline (``index · 960`` in a
    1/48000 time base), which aiortc turns into the RTP timestamp as is. Mono: the SDP
    says ``opus/48000/2`` for every Opus stream, and decoders play mono packets.
    """

    def __init__(self, bitrate: int = OPUS_BITRATE) -> None:
        self._time_base = fractions.Fraction(1, OUT_RATE)
        codec = av.CodecContext.create("libopus", "w")
        codec.sample_rate = OUT_RATE
        codec.layout = "mono"
        codec.format = "flt"
        codec.bit_rate = bitrate
        codec.time_base = self._time_base
        # "lowdelay" (CELT only) at complexity 5: at 48 kbit/s the voice comes back
        # closer to the original (22.8 dB SNR on the bundled speech sample against 11.9
        # for "voip"), 4 ms sooner (2.5 ms of codec delay against 6.4) and for less than
        # half the CPU (0.097 ms per chunk against 0.222 on the development VM).
        codec.options = {
            "application": "lowdelay",
            "frame_duration": "20",
            "compression_level": "5",
        }
        codec.open()
        self._codec = codec

    def encode(self, chunk: np.ndarray, index: int) -> av.Packet[Any]:
        """The Opus packet for chunk ``index`` (``CHUNK_SAMPLES`` float32 samples)."""
        if chunk.shape != (CHUNK_SAMPLES,):
            raise ValueError(f"an audio chunk is {CHUNK_SAMPLES} samples, got {chunk.shape}")
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(chunk, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = OUT_RATE
        frame.pts = index * CHUNK_SAMPLES
        frame.time_base = self._time_base
        packets = self._codec.encode(frame)
        if len(packets) != 1:  # libopus emits exactly one packet per full frame
            raise RuntimeError(f"libopus returned {len(packets)} packets for one 20 ms frame")
        return stamped(bytes(packets[0]), index)


def stamped(payload: bytes, index: int) -> av.Packet[Any]:
    """An Opus packet carrying ``payload`` at chunk ``index`` of the timeline."""
    packet = av.Packet(payload)
    packet.pts = index * CHUNK_SAMPLES
    packet.time_base = fractions.Fraction(1, OUT_RATE)
    return packet


#: One 20 ms Opus frame of silence, what a chunk that must not be heard is replaced by
#: (any valid Opus packet decodes whatever came before it).
SILENCE = bytes(OpusChunkEncoder().encode(np.zeros(CHUNK_SAMPLES, dtype=np.float32), 0))


class AvatarAudioTrack(MediaStreamTrack):
    """The session's audio timeline, delayed to match the video, as 20 ms Opus packets."""

    kind = "audio"

    def __init__(self, clock: SessionClock, source: PacketSource) -> None:
        super().__init__()
        self._clock = clock
        self._source = source
        self._next = 0
        self.chunks_skipped = 0

    @property
    def next_index(self) -> int:
        """The next 20 ms chunk this track will send."""
        return self._next

    async def recv(self) -> av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        index, skipped = await _wait_for_slot(self._clock, self._next, AUDIO_CHUNK_S)
        self.chunks_skipped += skipped
        self._next = index + 1
        return self._source(index)
