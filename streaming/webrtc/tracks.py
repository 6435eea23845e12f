"""Outbound WebRTC tracks paced by one session clock, so lips and sound stay together.

Video frame ``n`` (the face for audio time ``n/fps``) and audio chunk ``m`` (audio time
``m·20 ms``) are both handed to aiortc at ``start + delay + their audio time``; a track
that falls behind catches up or skips to the current slot
(:mod:`~streaming.webrtc.pacing`), so lateness never turns into growing latency.

Both tracks hand aiortc what it can send with the least work on the event loop: video
frames wrap the composed yuv420p array without a copy, and audio chunks arrive as Opus
packets, encoded off the loop when the session's timeline makes them (aiortc would
otherwise hop to a thread per 20 ms chunk to encode it and compute an RFC 6465 audio
level sample by sample in Python).
"""

from __future__ import annotations

import fractions
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from streaming.audio_rates import AUDIO_CHUNK_S, CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.dtx import OpusDtx
from streaming.webrtc.pacing import SessionClock, wait_for_slot

if TYPE_CHECKING:
    from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)

VIDEO_CLOCK = 90_000
#: Opus bitrate of the outgoing voice (mono, 20 ms frames): transparent for speech.
OPUS_BITRATE = 48_000


#: What a track does when its source fails: told the stage and the error (the session
#: ends the call, ``docs/design/threads.md`` §7).
OnFailure = Callable[[str, BaseException], None]


class VideoSource(Protocol):
    """Where the video track takes frame ``n`` from (the session's renderer)."""

    async def frame_for(self, index: int) -> np.ndarray:
        """Frame ``index`` as a yuv420p array, for aiortc to encode."""
        ...

    async def packet_for(self, index: int, encoder: LipstreamH264Encoder) -> av.Packet[Any]:
        """Frame ``index`` encoded by ``encoder`` into RTP payloads."""
        ...

    def sent(self, index: int) -> None:
        """Frame ``index`` was handed to aiortc."""
        ...


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
    """The avatar video: frame ``n`` comes from ``source``, at its slot on ``clock``.

    Until :meth:`encode_with` gives it the sender's encoder, frames go to aiortc as
    arrays for it to encode; after, each comes encoded off the loop
    (:meth:`VideoSource.packet_for`) and aiortc only sends its payloads. A source that
    fails is reported to ``on_failure`` as the ``encode`` stage, and the track ends.
    With ``join_late`` (a viewer of a running session) the first slot is the one due
    when media starts to flow, not slot 0.
    """

    kind = "video"

    def __init__(
        self,
        clock: SessionClock,
        fps: int,
        source: VideoSource,
        on_failure: OnFailure,
        *,
        join_late: bool = False,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._fps = fps
        self._source = source
        self._on_failure = on_failure
        self._encoder: LipstreamH264Encoder | None = None
        self._next = 0
        self._join_late = join_late
        self.frames_sent = 0
        self.frames_skipped = 0

    def encode_with(self, encoder: LipstreamH264Encoder) -> None:
        """Send frames encoded by ``encoder``, the sender's own (before media flows)."""
        self._encoder = encoder

    def stop(self) -> None:
        super().stop()
        if self._encoder is not None:  # no frame is encoded for a stopped track
            self._encoder.close()

    @property
    def next_index(self) -> int:
        """The next frame this track will send (earlier frames are no longer wanted)."""
        return self._next

    async def recv(self) -> av.VideoFrame | av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        if self._join_late:  # a viewer of a running session starts at the slot due now
            self._join_late = False
            self._next = max(self._next, self._clock.slots_due(1.0 / self._fps))
        slot = await wait_for_slot(self._clock, self._next, 1.0 / self._fps)
        self.frames_skipped += slot.skipped
        index = slot.index
        self._next = index + 1
        try:
            if self._encoder is not None:
                media: np.ndarray | av.Packet[Any] = await self._source.packet_for(
                    index, self._encoder
                )
            else:
                media = await self._source.frame_for(index)
        except Exception as exc:  # aiortc's sender would only log it, and stop sending
            self._on_failure("encode", exc)
            self.stop()
            raise MediaStreamError from exc
        self.frames_sent += 1
        self._source.sent(index)
        if isinstance(media, av.Packet):
            return media  # aiortc sends a packet's payloads as they are
        return video_frame(media, index, self._fps)


PacketSource = Callable[[int], "av.Packet[Any]"]
#: ``quiet(first, last)``: the last slot in ``first..last`` up to which every chunk is
#: sure to be silence (made, silent, waited for by nothing); ``first - 1`` if none is.
AudioQuiet = Callable[[int, int], int]


class OpusChunkEncoder:
    """Encodes 20 ms float32 mono chunks at 48 kHz to Opus, one packet per chunk.

    Packets are stamped with their chunk's place on the timeline (``index · 960`` in a
    1/48000 time base), which aiortc turns into the RTP timestamp as is. Mono: the SDP
    says ``opus/48000/2`` for every Opus stream, and decoders play mono packets.

    Digital silence is not encoded once the codec has nothing left to send: zeros after
    sound are encoded until libopus itself makes :data:`SILENCE` of them (its look-ahead
    and post-filter tail are out, byte for byte as if every chunk were encoded); from
    then on a chunk of zeros is :data:`SILENCE` stamped for its place, and a listening
    call costs no encoder run (``chunks_encoded`` and ``chunks_silent`` count both). The
    speech after such a gap starts from a codec that skipped the gap, so its first
    packets differ in rate control from those of one that encoded it; what is heard
    differs far less than the codec's own error (``tests/test_media_tracks.py``).

    With ``fec_percent`` (the loss the caller reports, ``docs/design/link.md`` §19) the
    encoder adds in-band FEC for that much loss: libopus's ``voip`` mode (its SILK and
    hybrid frames carry FEC; ``lowdelay`` is CELT only and cannot), 4 ms more codec
    delay, only for calls whose caller loses packets.
    """

    def __init__(self, bitrate: int = OPUS_BITRATE, *, fec_percent: int = 0) -> None:
        self.fec_percent = fec_percent
        self._time_base = fractions.Fraction(1, OUT_RATE)
        codec = av.CodecContext.create("libopus", "w")
        codec.sample_rate = OUT_RATE
        codec.layout = "mono"
        codec.format = "flt"
        codec.bit_rate = bitrate
        codec.time_base = self._time_base
        # "lowdelay" (CELT only) at complexity 5, constrained VBR: at 48 kbit/s the voice
        # comes back closer to the original (17.3 dB SNR on the bundled speech sample
        # against 11.9 for "voip"), 4 ms sooner (2.5 ms of codec delay against 6.4) and
        # for less than half the CPU (0.097 ms per chunk against 0.222 on the
        # development VM). Unconstrained, libopus spent 90 kbit/s on that speech
        # (22.8 dB): a voice twice what the link's estimate leaves it (docs/design/link.md
        # §19).
        codec.options = {
            "application": "lowdelay",
            "frame_duration": "20",
            "compression_level": "5",
            "vbr": "constrained",
        }
        if fec_percent > 0:
            codec.options = {
                "application": "voip",
                "frame_duration": "20",
                "compression_level": "5",
                "vbr": "constrained",
                "fec": "1",
                "packet_loss": str(min(100, fec_percent)),
            }
        codec.open()
        self._codec: av.AudioCodecContext | None = codec
        # A codec that has encoded nothing yet would start the first sound it is given
        # ~40 ms late (its first frame has no energies to predict from): it encodes one
        # frame of silence first, as it would have had no silence been skipped.
        self.chunks_encoded = 0
        self.chunks_silent = 0
        #: What the codec made of its first 20 ms of zeros (:data:`SILENCE`).
        self.silence_packet = bytes(self._encode(np.zeros(CHUNK_SAMPLES, np.float32), -1))
        self.chunks_encoded = 0
        self._settled = True  # the codec makes SILENCE of zeros: they need no encoding

    @property
    def settled(self) -> bool:
        """The codec has nothing left to send: a chunk of zeros now is :data:`SILENCE`,
        stamped for its place, with no encoder run."""
        return self._settled

    def close(self) -> None:
        """Free the codec now (libopus, and PyAV's resampler in front of it with the
        threads its filter graph runs on) rather than whenever Python frees this
        encoder (:meth:`MonoResampler.close <streaming.audio_in.resample.MonoResampler.close>`
        says why); encoding after this raises."""
        self._codec = None

    def encode(self, chunk: np.ndarray, index: int) -> av.Packet[Any]:
        """The Opus packet for chunk ``index`` (``CHUNK_SAMPLES`` float32 samples)."""
        if chunk.shape != (CHUNK_SAMPLES,):
            raise ValueError(f"an audio chunk is {CHUNK_SAMPLES} samples, got {chunk.shape}")
        sound = bool(chunk.any())
        if not sound and self._settled:
            self.chunks_silent += 1
            return stamped(SILENCE, index)
        packet = self._encode(chunk, index)
        self._settled = not sound and bytes(packet) == SILENCE
        return packet

    def _encode(self, chunk: np.ndarray, index: int) -> av.Packet[Any]:
        self.chunks_encoded += 1
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(chunk, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = OUT_RATE
        frame.pts = index * CHUNK_SAMPLES
        frame.time_base = self._time_base
        if self._codec is None:
            raise RuntimeError("this Opus encoder is closed")
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


def fec_percent(loss: float) -> int:
    """The packet loss, in percent, an Opus encoder is told to protect against for a
    caller that reports ``loss`` (0: no FEC, below 1 % loss)."""
    if loss < 0.01:
        return 0
    return next((step for step in (5, 10, 20, 30) if loss * 100 <= step), 40)


#: One 20 ms Opus frame of silence, what a chunk that must not be heard is replaced by
#: (any valid Opus packet decodes whatever came before it), and what digital silence is
#: sent as: what libopus makes of 20 ms of zeros, with this module's settings.
SILENCE = OpusChunkEncoder().silence_packet


class AvatarAudioTrack(MediaStreamTrack):
    """The session's audio timeline, delayed to match the video, as 20 ms Opus packets
    from ``source``; a source that fails is reported to ``on_failure`` (``audio send``).

    After :meth:`send_dtx`, the avatar's silence goes out as Opus DTX
    (:mod:`~streaming.webrtc.dtx`), and the track sleeps through the slots that send
    nothing, as far as ``quiet`` says the chunks are sure to be silence: the track never
    sleeps past a chunk not made yet, one with sound, or one an utterance or a speech
    event waits for, so those slots are taken from ``source`` on time, as before.
    """

    kind = "audio"

    def __init__(
        self,
        clock: SessionClock,
        source: PacketSource,
        on_failure: OnFailure,
        *,
        join_late: bool = False,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._source = source
        self._on_failure = on_failure
        self._next = 0
        self._join_late = join_late
        self._dtx: OpusDtx | None = None
        self._quiet: AudioQuiet | None = None
        self._sleeping_from: int | None = None  # the first slot of a DTX sleep
        self.chunks_skipped = 0
        self.dtx_slots = 0  # slots DTX sent nothing for

    def send_dtx(self, quiet: AudioQuiet | None) -> None:
        """Send silence as DTX from now on (the caller asked: ``usedtx=1``)."""
        self._dtx = OpusDtx(SILENCE)
        self._quiet = quiet

    @property
    def next_index(self) -> int:
        """The next 20 ms chunk this track will send (in a DTX sleep: the slot due now,
        since the track has already decided the slots up to its wake-up)."""
        if self._sleeping_from is None:
            return self._next
        due = self._clock.slots_due(AUDIO_CHUNK_S)
        return max(self._sleeping_from, min(self._next, due))

    async def recv(self) -> av.Packet[Any]:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            if self._join_late:  # as the video track's
                self._join_late = False
                self._next = max(self._next, self._clock.slots_due(AUDIO_CHUNK_S))
            slot = await wait_for_slot(self._clock, self._next, AUDIO_CHUNK_S)
            self._sleeping_from = None
            self.chunks_skipped += slot.skipped
            index = slot.index
            self._next = index + 1
            try:
                packet = self._source(index)
            except Exception as exc:
                self._on_failure("audio send", exc)
                self.stop()
                raise MediaStreamError from exc
            if self._dtx is None:
                return packet
            payload = bytes(packet)
            sent = self._dtx.payload(index, payload)
            if sent is payload:
                return packet
            if sent is not None:
                return stamped(sent, index)
            self.dtx_slots += 1
            wake = self._dtx.next_send(index)
            if wake > index + 1:  # no sleep past what nobody says is silence
                quiet = self._quiet
                wake = index + 1 if quiet is None else min(wake, quiet(index + 1, wake - 1) + 1)
            if wake > index + 1:
                self._sleeping_from = index + 1
            self.dtx_slots += wake - index - 1  # the slots slept through
            self._next = wake


async def pull(
    track: MediaStreamTrack,
    into: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """Take ``track``'s media slot by slot until it stops, as a sender would, sending
    each frame or packet ``into`` a sink, or nowhere (a session without a caller,
    ``streaming/broadcast/station.py``)."""
    while True:
        try:
            media = await track.recv()
        except MediaStreamError:
            return
        if into is not None:
            await into(media)
