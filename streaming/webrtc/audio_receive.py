"""A caller's audio packets go on to the decoder as they arrive, not after a prefetch.

aiortc's receiver puts audio through a jitter buffer that releases packet ``k`` only once
packet ``k + 4`` is in (80 ms of delay on every call), and after one lost packet waits
until its 16 slots overflow and then stays full, releasing one packet per arrival: a
single loss adds about 220 ms for the rest of the call. A live call needs neither. The
session's mixer absorbs jitter itself (``docs/design/audio-in.md`` §2): a packet that comes
late while the caller speaks leaves its tick to be made up by libopus
(:meth:`ArrivalOrderAudioBuffer.conceal`) and is skipped when it arrives, and slack that
is not needed is skipped again. So :class:`ArrivalOrderAudioBuffer` hands every
packet on at once; one older than a packet already handed on (reordered or repeated) is
dropped, its 20 ms lost rather than played out of order.

It stands in for aiortc's buffer through ``streaming.webrtc.compat``
(:func:`~streaming.webrtc.compat.install_audio_receive_buffer`), with the same
``add(packet) -> (pli, frame)`` contract.

Given a ``decode_into`` sink, it also decodes Opus packets itself, on the event loop as
they arrive (≈50 µs for 20 ms), straight to 48 kHz mono, and hands aiortc nothing for
them. aiortc would queue each packet to its decoder thread, which decodes to stereo and
posts every frame back with ``run_coroutine_threadsafe`` (a future and a task per 20 ms)
to the remote track, whose consumer then resamples it to mono on the loop: two thread
hand-offs, three task wake-ups and a resampler per packet, for work the loop can do in
50 µs (``docs/design/audio-in.md`` §2). Packets of other codecs go aiortc's way.

Opus is decoded with libopus itself (:mod:`~streaming.webrtc.opus_decoder`), so a
lost packet costs less: when a packet arrives after a gap of at most
:data:`MAX_CONCEALED` packets, the one just before it is rebuilt from this packet's
in-band FEC (the answer asks callers to send it), the ones before that are concealed by
libopus, and the mixer gets whole 20 ms for each (``docs/design/link.md`` §19). Where
no libopus loads, PyAV decodes and a lost packet's 20 ms are lost, as before.

A caller that sends digital silence (a muted microphone, an app's text-to-speech track
between utterances) sends the same small Opus packet over and over. Once that payload
has decoded to zeros twice running, the decoder is at rest on it: the same payload again
is zeros of the same length without decoding (a listening call, issue 26).

A browser's silence is not quite zeros: libopus decodes Chromium's silent microphone (a
muted track, or with DTX its comfort-noise updates and 1-byte DTX frames) to samples of
±1 in 16 bits, −90 dBFS. Decoded audio within :data:`SILENCE_FLOOR` of zero is passed on
as zeros, so such a caller gets every shortcut a digitally silent one does
(``docs/design/audio-in.md`` §2, ``docs/design/idle-loops.md`` §16); nothing that quiet
can be heard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import av
import numpy as np
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.opus_decoder import OpusDecoder, OpusUnavailableError, load_libopus

logger = logging.getLogger(__name__)

#: Sequence numbers are 16 bits; a packet at most half the range behind is "older".
_HALF_RANGE = 0x8000
#: Longer gaps are not made up (a caller that paused, or a stream that restarted).
MAX_CONCEALED = 5
#: libopus conceals whole 2.5 ms steps (120 samples at 48 kHz).
_CONCEAL_STEP = 120


_S16_SCALE = np.float32(1 / 32768)
#: Decoded audio no sample of which is further from zero than this (2 steps of 16-bit
#: audio, −84 dBFS) is digital silence (module doc).
SILENCE_FLOOR = np.float32(2 / 32768)


def _silent(samples: np.ndarray) -> bool:
    """Whether every sample is within :data:`SILENCE_FLOOR` of zero."""
    return bool(samples.max() <= SILENCE_FLOOR and samples.min() >= -SILENCE_FLOOR)


class ArrivalOrderAudioBuffer:
    """Passes each audio packet on as it arrives; drops one that comes after a later one.

    With ``decode_into``, packets whose payload type is in ``opus_payload_types`` are
    decoded here and their float32 48 kHz mono samples go to ``decode_into`` instead.
    Anything but one bad packet that fails there (``decode_into`` raising, the decoder
    breaking) goes to ``on_failure`` once, and the buffer drops every packet after it:
    aiortc's receive path would only log it, and the call would go on deaf.
    """

    def __init__(
        self,
        decode_into: Callable[[np.ndarray], None] | None = None,
        opus_payload_types: Collection[int] = (),
        *,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._last: int | None = None  # sequence number handed on last
        self._decode_into = decode_into
        self._opus = frozenset(opus_payload_types) if decode_into is not None else frozenset()
        self._decoder: av.AudioCodecContext | None = None
        self._libopus: OpusDecoder | None = None
        self._use_libopus = self._opus and _libopus_available()
        self._on_failure = on_failure
        self.failed: BaseException | None = None
        self.passed = 0
        self.dropped = 0  # reordered or repeated packets
        self.decoded = 0
        self.undecodable = 0
        self.silent = 0  # packets taken as silence without decoding
        self.recovered = 0  # lost packets rebuilt from the next one's FEC
        self.concealed = 0  # lost packets concealed by libopus
        self.concealed_late = 0  # ticks made up by libopus for a packet not in yet
        self._zeros_from: bytes | None = None  # the payload that last decoded to zeros
        self._at_rest: tuple[bytes, int] | None = None  # ... twice running: its samples

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """The frame to decode for ``packet`` (its depayloaded data), or None to drop it.

        The first item is aiortc's "ask for a key frame" flag: never, for audio.
        """
        if self.failed is not None:
            return False, None
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
        missing = 0 if self._last is None else (sequence - self._last - 1) % 0x10000
        self._last = sequence
        self.passed += 1
        if packet.payload_type in self._opus:
            try:
                if 0 < missing <= MAX_CONCEALED and self._use_libopus:
                    self._make_up(data, missing)
                self._decode(data)
            except Exception as exc:
                self.failed = exc
                if self._on_failure is None:
                    raise
                self._on_failure(exc)
            return False, None
        return False, JitterFrame(data=data, timestamp=packet.timestamp)

    def conceal(self, samples: int) -> np.ndarray | None:
        """At least ``samples`` of the caller's voice, made up by libopus after the last
        packet decoded: the session's tick came before the next packet did
        (``docs/design/audio-in.md`` §2). None where this buffer does not decode with
        libopus, has failed, or is at rest on a silent payload. The late packet is
        decoded as usual when it comes, on the same decoder (libopus carries on from
        its concealment)."""
        decoder = self._libopus
        if decoder is None or self.failed is not None or self._at_rest is not None:
            return None
        frames = -(-samples // _CONCEAL_STEP) * _CONCEAL_STEP
        try:
            made = decoder.decode(None, samples=frames)
        except ValueError:
            return None
        self.concealed_late += 1
        return made

    def _make_up(self, data: bytes, missing: int) -> None:
        """The ``missing`` packets before ``data``: the last from its FEC, the rest
        concealed (on the same decoder, before ``data`` itself)."""
        assert self._decode_into is not None
        decoder = self._libopus_decoder()
        self._at_rest = None
        samples = decoder.samples_in(data)
        samples = samples if samples > 0 else CHUNK_SAMPLES
        try:
            for _ in range(missing - 1):
                self._decode_into(decoder.decode(None, samples=samples))
                self.concealed += 1
            self._decode_into(decoder.decode(data, fec=True, samples=samples))
        except ValueError as exc:  # one bad packet costs its 20 ms, not the call
            self.undecodable += 1
            logger.debug("undecodable Opus packet from the caller: %s", exc)
            return
        if decoder.has_fec(data) is False:
            self.concealed += 1
        else:
            self.recovered += 1

    def _libopus_decoder(self) -> OpusDecoder:
        if self._libopus is None:
            self._libopus = OpusDecoder()
        return self._libopus

    def _decode(self, data: bytes) -> None:
        assert self._decode_into is not None
        if self._at_rest is not None and data == self._at_rest[0]:
            self.silent += 1
            self._decode_into(np.zeros(self._at_rest[1], dtype=np.float32))
            return
        self._at_rest = None
        if self._use_libopus:
            try:
                samples = self._libopus_decoder().decode(data)
            except ValueError as exc:
                self.undecodable += 1
                logger.debug("undecodable Opus packet from the caller: %s", exc)
                return
            self.decoded += 1
            zeros = _silent(samples)
            self._decode_into(np.zeros_like(samples) if zeros else samples)
            self._note_zeros(data, len(samples), zeros)
            return
        if self._decoder is None:
            decoder = av.CodecContext.create("libopus", "r")
            decoder.sample_rate = OUT_RATE
            decoder.layout = "mono"
            self._decoder = decoder
        try:
            frames = self._decoder.decode(av.Packet(data))
        except av.FFmpegError as exc:  # one bad packet costs its 20 ms, not the call
            self.undecodable += 1
            logger.debug("undecodable Opus packet from the caller: %s", exc)
            return
        count, zeros = 0, True
        for frame in frames:
            samples = frame.to_ndarray().reshape(-1)
            if samples.dtype == np.int16:  # libopus decodes to s16 whatever is asked
                samples = samples.astype(np.float32) * _S16_SCALE
            self.decoded += 1
            count += len(samples)
            silent = _silent(samples)
            zeros = zeros and silent
            self._decode_into(
                np.zeros(len(samples), np.float32)
                if silent
                else samples.astype(np.float32, copy=False)
            )
        self._note_zeros(data, count, zeros)

    def _note_zeros(self, data: bytes, count: int, zeros: bool) -> None:
        """``data`` decoded to ``count`` samples, all zero or not: twice the same payload
        to zeros and the decoder is at rest on it (module doc)."""
        if not (zeros and count):
            self._zeros_from = None
        elif data == self._zeros_from:
            self._at_rest = (data, count)
        else:
            self._zeros_from = data


def _libopus_available() -> bool:
    try:
        load_libopus()
    except OpusUnavailableError as exc:
        logger.warning("%s; the caller's Opus is decoded by PyAV, without FEC", exc)
        return False
    return True
