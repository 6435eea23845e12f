"""The "ave" mel spectrogram that SyncTalk_2D and Wav2Lip were trained with.

The recipe is ``docs/design/model.md`` §3.

Pre-emphasis 0.97, a centred STFT (reflect padding, periodic Hann, n_fft=800, hop=200),
magnitude → 80 Slaney mel bands (55–7600 Hz) → dB − 20 → normalised to [−4, 4].
The numbers match librosa (``librosa.stft`` + ``librosa.filters.mel``) without importing it.

There is one implementation: :class:`StreamingMel`. The offline :func:`melspectrogram`
is ``push(all) + flush()``, and every per-frame operation is chosen so that a frame's
values do not depend on which other frames were computed in the same call, so any
chunking of the input gives bit-identical output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]

#: The sample rate every trained model's audio features are computed from (16 kHz mono).
#: Audio arrives at other rates (a call's 48 kHz, a file's own) and is resampled to this
#: only where features are made.
FEATURE_RATE = 16_000


@dataclass(frozen=True, slots=True)
class MelConfig:
    """Parameters of the mel spectrogram; the defaults are the trained models' values."""

    sample_rate: int = FEATURE_RATE
    n_fft: int = 800
    hop: int = 200
    win: int = 800
    n_mels: int = 80
    fmin: float = 55.0
    fmax: float = 7600.0
    preemphasis: float = 0.97
    ref_level_db: float = 20.0
    min_level_db: float = -100.0
    max_abs_value: float = 4.0
    min_amplitude: float = 1e-5

    def __post_init__(self) -> None:
        if self.win != self.n_fft:
            # Every trained model uses win == n_fft; supporting a shorter window would
            # mean centring it inside the frame, which nothing here needs.
            raise ValueError(f"win must equal n_fft ({self.n_fft}), got {self.win}")
        if self.hop <= 0 or self.n_fft <= 0 or self.n_fft % 2:
            raise ValueError(
                f"n_fft must be a positive even number and hop positive, "
                f"got n_fft={self.n_fft}, hop={self.hop}"
            )
        if not 0.0 <= self.fmin < self.fmax <= self.sample_rate / 2:
            raise ValueError(
                f"need 0 <= fmin < fmax <= sample_rate/2, got fmin={self.fmin}, "
                f"fmax={self.fmax}, sample_rate={self.sample_rate}"
            )

    @property
    def frames_per_second(self) -> float:
        """Mel frames per second of audio (80 for the defaults)."""
        return self.sample_rate / self.hop


# Slaney's mel scale (librosa htk=False): linear below 1 kHz, logarithmic above.
_SLANEY_F_SP = 200.0 / 3.0
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = float(np.log(6.4) / 27.0)


def _hz_to_mel(hz: float) -> float:
    if hz >= _SLANEY_MIN_LOG_HZ:
        return _SLANEY_MIN_LOG_MEL + float(np.log(hz / _SLANEY_MIN_LOG_HZ)) / _SLANEY_LOGSTEP
    return hz / _SLANEY_F_SP


def _mel_to_hz(mels: Float64Array) -> Float64Array:
    hz = _SLANEY_F_SP * mels
    log_part = mels >= _SLANEY_MIN_LOG_MEL
    hz[log_part] = _SLANEY_MIN_LOG_HZ * np.exp(
        _SLANEY_LOGSTEP * (mels[log_part] - _SLANEY_MIN_LOG_MEL)
    )
    return hz


def mel_filterbank(cfg: MelConfig | None = None) -> Float64Array:
    """Triangular mel filters ``[n_mels, n_fft//2 + 1]`` in float64.

    Slaney mel scale and Slaney area normalisation: identical to
    ``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)`` (htk=False, norm="slaney").
    """
    cfg = cfg or MelConfig()
    fft_freqs = np.fft.rfftfreq(cfg.n_fft, d=1.0 / cfg.sample_rate)
    mel_points = np.linspace(_hz_to_mel(cfg.fmin), _hz_to_mel(cfg.fmax), cfg.n_mels + 2)
    edges = _mel_to_hz(mel_points)
    widths = np.diff(edges)
    ramps = edges[:, np.newaxis] - fft_freqs[np.newaxis, :]
    lower = -ramps[:-2] / widths[:-1, np.newaxis]
    upper = ramps[2:] / widths[1:, np.newaxis]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    # Slaney normalisation: each filter has (approximately) constant area.
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, np.newaxis]
    return weights


def periodic_hann(length: int) -> Float64Array:
    """Periodic Hann window, as ``scipy.signal.get_window("hann", length)``."""
    n = np.arange(length, dtype=np.float64)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / length)


class StreamingMel:
    """Incremental mel spectrogram: push samples, get the frames that became complete.

    Frame ``t`` covers pre-emphasised samples ``[t·hop − n_fft/2, t·hop + n_fft/2)`` of the
    reflect-padded signal, so it is complete once sample ``t·hop + n_fft/2`` has arrived
    (frame 0 needs ``n_fft/2 + 1`` samples for its reflected left half). The frames that
    reach into the right padding come out of :meth:`flush`. A stream of ``n`` samples yields
    ``1 + n // hop`` frames in total, exactly as ``librosa.stft(center=True)``.

    Only the samples that unfinished frames still need are kept (about ``n_fft`` plus the
    last push).
    """

    def __init__(self, cfg: MelConfig | None = None) -> None:
        self._cfg = cfg or MelConfig()
        self._basis = mel_filterbank(self._cfg)
        self._window = periodic_hann(self._cfg.win)
        self._pad = self._cfg.n_fft // 2
        # Every row's values depend on its own samples only (``_transform``), so the row
        # of an all-zero window is the same wherever it falls: bit for bit this one.
        self._silent_row = self._transform(np.zeros((1, self._cfg.n_fft)))[0]
        self.reset()

    @property
    def config(self) -> MelConfig:
        """The spectrogram parameters."""
        return self._cfg

    @property
    def samples_pushed(self) -> int:
        """Samples received since the start of the stream."""
        return self._n_samples

    @property
    def frames_emitted(self) -> int:
        """Mel frames returned so far since the start of the stream."""
        return self._next_frame

    @property
    def buffered_samples(self) -> int:
        """Samples held for frames not yet emitted (bounded by about n_fft + one push)."""
        return self._head.size + (0 if self._buf is None else self._buf.size)

    def reset(self) -> None:
        """Forget the stream: the next push starts a new signal."""
        self._prev_sample = 0.0  # lfilter's zero initial state: y[0] = x[0]
        self._n_samples = 0
        self._next_frame = 0
        # Pre-emphasised samples that arrived before the left reflect padding could be
        # built (it needs n_fft/2 + 1 samples).
        self._head: Float64Array = np.empty(0, dtype=np.float64)
        # The padded signal P (P[p] = y[p - pad], reflected at the left end) from
        # P index ``_buf_start`` on; ``None`` until the left padding exists.
        self._buf: Float64Array | None = None
        self._buf_start = 0

    def push(self, samples: npt.ArrayLike) -> FloatArray:
        """Add mono samples; return the mel frames that became complete, ``[k, n_mels]``."""
        x = np.asarray(samples, dtype=np.float64)
        if x.ndim != 1:
            raise ValueError(f"expected 1-D mono samples, got shape {x.shape}")
        if x.size == 0:
            return self._empty()
        y = self._preemphasise(x)
        self._n_samples += x.size
        if self._buf is None:
            self._head = np.concatenate((self._head, y))
            if self._head.size <= self._pad:
                return self._empty()
            left = self._head[self._pad : 0 : -1]
            self._buf = np.concatenate((left, self._head))
            self._buf_start = 0
            self._head = np.empty(0, dtype=np.float64)
        else:
            self._buf = np.concatenate((self._buf, y))
        # Frame t is complete when t·hop + n_fft <= pad + n (the padded length so far).
        last = (self._pad + self._n_samples - self._cfg.n_fft) // self._cfg.hop
        frames = self._emit(self._buf, self._buf_start, last)
        self._drop_consumed()
        return frames

    def flush(self) -> FloatArray:
        """End of stream: return the remaining frames (right reflect padding), then reset."""
        n = self._n_samples
        last = n // self._cfg.hop
        if n == 0:
            frames = self._empty()
        elif self._buf is None:
            # Shorter than the padding: nothing was emitted yet, so pad the whole signal
            # the way numpy/librosa do (repeated reflection; edge for a single sample).
            if self._head.size > 1:
                padded = np.pad(self._head, self._pad, mode="reflect")
            else:
                padded = np.pad(self._head, self._pad, mode="edge")
            frames = self._emit(padded, 0, last)
        else:
            right = self._buf[-2 : -(self._pad + 2) : -1]
            frames = self._emit(np.concatenate((self._buf, right)), self._buf_start, last)
        self.reset()
        return frames

    def _preemphasise(self, x: Float64Array) -> Float64Array:
        previous = np.empty(x.size, dtype=np.float64)
        previous[0] = self._prev_sample
        previous[1:] = x[:-1]
        self._prev_sample = float(x[-1])
        # Same element-wise arithmetic for every sample, whatever the chunking.
        return x - self._cfg.preemphasis * previous

    def _emit(self, padded: Float64Array, padded_start: int, last: int) -> FloatArray:
        """Frames ``_next_frame .. last`` from ``padded`` (P indices from ``padded_start``)."""
        first = self._next_frame
        if last < first:
            return self._empty()
        hop, n_fft = self._cfg.hop, self._cfg.n_fft
        offset = first * hop - padded_start
        count = last - first + 1
        region = padded[offset : offset + (count - 1) * hop + n_fft]
        self._next_frame = last + 1
        if not region.any():  # all digital silence: silence's row for each, no framing
            return np.repeat(self._silent_row[np.newaxis], count, axis=0)
        windows = np.lib.stride_tricks.sliding_window_view(region, n_fft)[::hop]
        return self._frames_to_mel(windows)

    def _frames_to_mel(self, frames: Float64Array) -> FloatArray:
        """Mel frames of ``frames`` (padded windows); one of digital silence is not
        transformed: it is the row silence always gives, computed once."""
        sound = frames.any(axis=1)
        if sound.all():
            return self._transform(frames)
        mel = np.empty((len(frames), self._cfg.n_mels), dtype=np.float32)
        mel[~sound] = self._silent_row
        if sound.any():
            mel[sound] = self._transform(frames[sound])
        return mel

    def _transform(self, frames: Float64Array) -> FloatArray:
        cfg = self._cfg
        magnitude = np.abs(np.fft.rfft(frames * self._window, n=cfg.n_fft, axis=-1))
        # einsum's own loop reduces every row in the same order however many rows there
        # are; a BLAS matmul does not, and streaming must equal offline bit for bit.
        mel: Float64Array = np.einsum("tf,mf->tm", magnitude, self._basis)
        db = 20.0 * np.log10(np.maximum(cfg.min_amplitude, mel)) - cfg.ref_level_db
        scaled = (2.0 * cfg.max_abs_value) * (db - cfg.min_level_db) / (
            -cfg.min_level_db
        ) - cfg.max_abs_value
        return np.clip(scaled, -cfg.max_abs_value, cfg.max_abs_value).astype(np.float32)

    def _drop_consumed(self) -> None:
        # The next frame starts at P index next·hop; everything before it is done with,
        # except the last pad+1 samples, which the right reflect padding at flush reads.
        if self._buf is None:
            return
        tail_start = self._n_samples - 1  # P index of y[n - 1 - pad]
        keep_from = min(self._next_frame * self._cfg.hop, tail_start) - self._buf_start
        if keep_from > 0:
            self._buf = self._buf[keep_from:].copy()
            self._buf_start += keep_from

    def _empty(self) -> FloatArray:
        return np.empty((0, self._cfg.n_mels), dtype=np.float32)


def melspectrogram(samples: npt.ArrayLike, cfg: MelConfig | None = None) -> FloatArray:
    """Mel spectrogram of a whole signal, ``[1 + len // hop, n_mels]`` float32.

    Defined as one :class:`StreamingMel` fed everything at once, so it is bit-identical
    to streaming the same samples in any chunk sizes.
    """
    stream = StreamingMel(cfg)
    head = stream.push(samples)
    frames: FloatArray = np.concatenate((head, stream.flush()))
    return frames
