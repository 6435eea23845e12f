"""Raw PCM that arrives in pieces (a WebSocket stream), decoded to 48 kHz mono float32.

The declared format and rate are checked once, when the stream opens; each binary
message is then checked on its own (whole samples, at most :data:`MAX_MESSAGE_S` of
audio, finite floats) and converted exactly as a whole raw-PCM push is
(:func:`~streaming.audio_in.push.decode_pushed_audio`): to float, clipped to [-1, 1],
resampled to the mixer's 48 kHz (``docs/design/audio-in.md`` §2) by a resampler that keeps
its state between the messages of an utterance and is flushed at its end. So the same
audio gives the same samples, and the same lip-sync, whichever way it arrives. A refused
message leaves that state untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from streaming.audio_in.exceptions import AudioFrameError, StreamFormatError
from streaming.audio_in.resample import MonoResampler
from streaming.audio_rates import OUT_RATE

#: Sample formats a stream may declare, and their numpy dtypes (little-endian).
STREAM_FORMATS: Mapping[str, str] = MappingProxyType({"s16le": "<i2", "f32le": "<f4"})
#: Sample rates a stream may declare: what TTS engines and browsers produce.
STREAM_RATES: tuple[int, ...] = (16_000, 22_050, 24_000, 44_100, 48_000)
#: The most audio one message may carry.
MAX_MESSAGE_S = 1.0


#: The most channels a stream may interleave (a LiveKit agent's byte stream may be
#: stereo; its channels are averaged to the mixer's mono).
MAX_CHANNELS = 8


@dataclass(frozen=True)
class StreamFormat:
    """A stream's declared sample format, rate and interleaved channels (mono unless
    said: WebSocket streams are; a LiveKit agent's byte stream names its own)."""

    format: str
    rate: int
    channels: int = 1

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> StreamFormat:
        """From query parameters ``format``, ``rate`` and ``channels`` (1 if absent)."""
        fmt = params.get("format", "").strip().lower()
        if fmt not in STREAM_FORMATS:
            raise StreamFormatError(
                f"format={params.get('format', '')!r} is not supported; declare one of "
                f"{', '.join(STREAM_FORMATS)}, e.g. ?format=s16le&rate=24000"
            )
        rates = ", ".join(map(str, STREAM_RATES))
        try:
            rate = int(params.get("rate", ""))
        except ValueError:
            rate = 0
        if rate not in STREAM_RATES:
            raise StreamFormatError(
                f"rate={params.get('rate', '')!r} is not supported; declare one of {rates} (Hz)"
            )
        if params.get("channels", "1").strip() != "1":
            raise StreamFormatError(
                f"channels={params.get('channels')!r}: streams are mono; mix to one channel "
                "and declare channels=1 (or leave it out)"
            )
        return cls(fmt, rate)

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample of every channel (one frame of interleaved audio)."""
        return np.dtype(STREAM_FORMATS[self.format]).itemsize * self.channels


class PcmStreamDecoder:
    """Decodes one stream's messages to 48 kHz mono float32, seamlessly across the messages
    of an utterance."""

    def __init__(self, stream_format: StreamFormat) -> None:
        self.format = stream_format
        self._dtype = np.dtype(STREAM_FORMATS[stream_format.format])
        self._resampler: MonoResampler | None = None
        self.restart()

    def restart(self) -> None:
        """Start a new utterance: drop whatever the resampler holds of the last one (cut
        by an interrupt; one that ended was flushed already)."""
        if self.format.rate != OUT_RATE:
            self._resampler = MonoResampler(self.format.rate, OUT_RATE)

    def samples_in(self, message: bytes) -> int:
        """How many samples ``message`` holds; :class:`AudioFrameError` if it is unusable."""
        size = self.format.sample_bytes
        if len(message) % size:
            raise AudioFrameError(
                f"a {self.format.format} message must be a whole number of {size}-byte "
                f"samples; this one has {len(message)} bytes"
            )
        count = len(message) // size
        limit = int(self.format.rate * MAX_MESSAGE_S)
        if count > limit:
            raise AudioFrameError(
                f"a message may carry at most {MAX_MESSAGE_S:g} s of audio ({limit} samples at "
                f"{self.format.rate} Hz); this one has {count}: send smaller pieces"
            )
        return count

    def decode(self, message: bytes) -> np.ndarray:
        """The 48 kHz samples of ``message`` ready so far (the resampler lags a few)."""
        self.samples_in(message)
        samples = np.frombuffer(message, dtype=self._dtype)
        if self._dtype.kind == "f":
            if not np.isfinite(samples).all():
                raise AudioFrameError("the message holds NaN or infinite samples")
            floats = np.clip(samples.astype(np.float32), -1.0, 1.0)
        else:
            floats = samples.astype(np.float32) / np.float32(32768.0)
        channels = self.format.channels
        # interleaved channels are averaged to the mixer's mono
        mono = floats if channels == 1 else floats.reshape(-1, channels).mean(axis=1)
        return self._out(mono if self._resampler is None else self._resampler.push(mono))

    def flush(self) -> np.ndarray:
        """The samples the resampler still holds (at the end of an utterance); the next
        message starts afresh."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._out(self._resampler.flush())
        self.restart()
        return tail

    @staticmethod
    def _out(samples: np.ndarray) -> np.ndarray:
        # Resampling filters ring a little past full scale, as a whole push is clipped.
        clipped: np.ndarray = np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)
        return clipped
