"""Per-video-frame audio inputs for the lip-sync models, streaming and offline alike.

``"ave"`` (SyncTalk_2D, ``docs/design/model.md`` §3): video frame ``m`` takes mel frames
``[int(3.2m), int(3.2m)+16)`` → audio-encoder ONNX → 512 values. The list of those
features is extended by repeating its first and last entry once, and frame ``i`` sees
extended rows ``i−8 … i+7`` (zero rows outside the list) reshaped to ``[32,16,16]``.

``"mel"`` (Wav2Lip): frame ``i`` sees the mel window ``[int(3.2i), +16)`` as ``[1,80,16]``.

There is one implementation, :class:`AudioFeatureStream`; :func:`offline_features` is a
stream fed the whole signal at once. A frame is emitted as soon as every input it uses is
final, so a live stream runs :func:`lookahead_ms` behind the audio (≈450 ms for the full
right context). Rows that depend on where the stream ends (the clamped last windows, the
repeated last feature) are final only at :meth:`AudioFeatureStream.flush`.

A live call infers only the frames its speech gate lets through, so its stream is pushed
with a :class:`FrameGate`: a frame the gate does not infer gets no features
(:data:`NO_FEATURES`) and costs no encoder run. Windows are still encoded in the batches
they became ready in, so a frame that is inferred gets the very values it gets without a
gate, and the windows of frames the gate will likely infer (around audio at or above its
threshold) are encoded as soon as their audio is there, as without a gate: the first
frame of speech finds its context done, and its latency is unchanged.

Why one module of about 400 lines: the stream is one state machine over four buffers
(samples, mel frames, encoded windows, frames emitted) that must be trimmed together;
its index arithmetic lives in :mod:`~inference_core.features.timing`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from inference_core.exceptions import ModelInputError
from inference_core.features.encoder import ENCODER_FEATURES, MEL_WINDOW, AudioEncoder
from inference_core.features.mel import FEATURE_RATE, MelConfig, StreamingMel
from inference_core.features.timing import (
    CONTEXT_LEFT,
    CONTEXT_ROWS,
    MAX_RIGHT_CONTEXT,
    FeatureKind,
    FrameTiming,
    check_args,
    lookahead_ms,
)

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

AVE_SHAPE = (32, 16, 16)
SILENCE_DB = -120.0
#: The features of a frame that its :class:`FrameGate` did not infer: none (size 0).
NO_FEATURES: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)
NO_FEATURES.flags.writeable = False


@dataclass(frozen=True, slots=True, eq=False)
class FrameAudio:
    """The audio input of one video frame.

    ``index`` is the video frame number (it shows time ``index / fps``); ``features`` is
    float32 ``[32,16,16]`` for kind "ave" or ``[1,80,16]`` for kind "mel"; ``level_db``
    is the RMS level in dBFS of the audio the frame covers (half a frame either side of
    its time) and of the next half frame (``FrameTiming.level_span``), :data:`SILENCE_DB` for
    digital silence.
    """

    index: int
    features: FloatArray
    level_db: float


class FrameGate(Protocol):
    """Which frames get features (the live speech gate, ``streaming.live.timeline``).

    ``infer`` is asked once per frame, in order, when the frame's inputs are final; a
    frame it declines carries :data:`NO_FEATURES`. ``threshold_db`` and ``frames_after``
    say which frames it will likely infer: those at or above the threshold and up to
    ``frames_after`` frames after each (a hangover, a fade). Only their windows are
    encoded ahead; a frame inferred outside them still gets its features, encoded when
    it is asked for.
    """

    @property
    def threshold_db(self) -> float: ...

    @property
    def frames_after(self) -> int: ...

    def infer(self, index: int, level_db: float) -> bool: ...


class AudioFeatureStream:
    """Turns 16 kHz mono PCM into per-video-frame model inputs, frame by frame.

    ``push`` returns, in order, every frame whose inputs became final; ``flush`` ends the
    stream and returns the rest, so that ``frames_for_samples(n)`` frames come out in all;
    ``reset`` drops everything (an interrupt). After ``flush`` the stream starts afresh
    at frame 0. ``right_context`` R (kind "ave") zeroes the feature rows after ``i+R``:
    each row less emits frames ≈40 ms sooner at some cost in lip-sync quality.

    Only what unfinished frames still need is kept: a few hundred ms of samples, mel
    frames and features.
    """

    def __init__(
        self,
        encoder: AudioEncoder | None,
        *,
        kind: FeatureKind = "ave",
        fps: int = 25,
        right_context: int = MAX_RIGHT_CONTEXT,
        sample_rate: int = FEATURE_RATE,
    ) -> None:
        check_args(kind, fps, right_context)
        cfg = MelConfig()
        if sample_rate != cfg.sample_rate:
            raise ValueError(
                f"sample_rate must be {cfg.sample_rate} (the models were trained on "
                f"{cfg.sample_rate} Hz audio), got {sample_rate}: resample first"
            )
        if kind == "ave" and encoder is None:
            raise ValueError("kind 'ave' needs an AudioEncoder; only kind 'mel' works without")
        self._encoder = encoder
        self._kind: FeatureKind = kind
        self._right_context = right_context if kind == "ave" else 0
        self._timing = FrameTiming(cfg, fps)
        self._mel = StreamingMel(cfg)
        self._windows_encoded = 0
        self._lookahead_ms = lookahead_ms(self._right_context, fps, kind=kind)
        logger.debug(
            "audio features %s at %d fps, right context %d: lookahead %.1f ms",
            kind,
            fps,
            self._right_context,
            self._lookahead_ms,
        )
        self.reset()

    @property
    def lookahead_ms(self) -> float:
        """Audio (ms) past a frame's own time that must arrive before it is emitted."""
        return self._lookahead_ms

    @property
    def kind(self) -> FeatureKind:
        """``"ave"`` (encoder features, SyncTalk_2D) or ``"mel"`` (mel windows, Wav2Lip)."""
        return self._kind

    @property
    def fps(self) -> int:
        """Video frames per second."""
        return self._timing.fps

    @property
    def right_context(self) -> int:
        """Future feature rows each frame uses (0 for kind "mel")."""
        return self._right_context

    @property
    def frames_emitted(self) -> int:
        """Frames returned since the stream started."""
        return self._next_frame

    @property
    def windows_encoded(self) -> int:
        """Mel windows run through the audio encoder since the stream was made."""
        return self._windows_encoded

    @property
    def memory_bytes(self) -> int:
        """Bytes of samples, mel frames and features held for frames not yet emitted."""
        return self._pcm.nbytes + self._mel_frames.nbytes + self._rows.nbytes

    def frames_for_samples(self, n: int) -> int:
        """Frames a finished stream of ``n`` samples yields: ``ceil(n · fps / 16000)``."""
        return -(-n * self._timing.fps // self._timing.cfg.sample_rate)

    def use_encoder(self, encoder: AudioEncoder | None) -> None:
        """Encode windows with ``encoder`` from now on (a call switched to an avatar with
        its own audio encoder). Rows already encoded stay: the frames about to be made
        mix the two encoders' rows for a window's length, during the switch's dissolve."""
        if self._kind == "ave" and encoder is None:
            raise ValueError("kind 'ave' needs an AudioEncoder; only kind 'mel' works without")
        self._encoder = encoder

    def reset(self) -> None:
        """Drop all audio and pending frames; the next push starts at frame 0."""
        n_mels = self._timing.cfg.n_mels
        self._mel.reset()
        self._n_samples = 0
        self._pcm: FloatArray = np.empty(0, dtype=np.float32)
        self._pcm_start = 0
        self._mel_frames: FloatArray = np.empty((0, n_mels), dtype=np.float32)
        self._mel_start = 0
        # Extended rows from ``_rows_start`` (row r is window r−1, row 0 repeats window 0),
        # one per window whose mel is final; those of ``_batches`` are not encoded yet.
        self._rows: FloatArray = np.empty((0, ENCODER_FEATURES), dtype=np.float32)
        self._rows_start = 0
        self._ready_windows = 0  # windows whose mel frames are final
        # Windows ready but not encoded, as the batches they became ready in: encoding a
        # batch as it came keeps every value what an ungated stream computes.
        self._batches: deque[tuple[int, int]] = deque()
        # Windows a loud frame made likely to be used: encoded as soon as they are ready.
        self._likely = (0, -1)
        self._levels: deque[float] = deque()  # of frames _next_frame… already measured
        self._next_frame = 0

    def push(self, pcm: npt.ArrayLike, gate: FrameGate | None = None) -> list[FrameAudio]:
        """Add mono 16 kHz PCM (float32 in [−1, 1] or int16); return the frames now final.

        With a ``gate``, only the frames it infers get features (module doc).
        """
        samples = _as_float32(pcm)
        if samples.size == 0:
            return []
        self._n_samples += samples.size
        self._pcm = np.concatenate((self._pcm, samples))
        self._mel_frames = np.concatenate((self._mel_frames, self._mel.push(samples)))
        if self._kind == "ave":
            stop = self._ready_windows
            while self._timing.window_start(stop) + MEL_WINDOW <= self._mel_count:
                stop += 1
            self._add_windows(stop)
            if gate is None:
                self._encode(0, stop - 1)
            else:
                self._encode_likely(gate)
        frames = self._emit_ready(gate)
        self._drop_consumed()
        return frames

    def flush(self) -> list[FrameAudio]:
        """End of stream: return the remaining frames, then start afresh."""
        total = self.frames_for_samples(self._n_samples)
        frames: list[FrameAudio] = []
        if total > self._next_frame:
            self._mel_frames = np.concatenate((self._mel_frames, self._mel.flush()))
            short = MEL_WINDOW - self._mel_count
            if short > 0:
                # Shorter than one window: continue it with what digital silence gives.
                floor = np.full(
                    (short, self._timing.cfg.n_mels),
                    -self._timing.cfg.max_abs_value,
                    dtype=np.float32,
                )
                self._mel_frames = np.concatenate((self._mel_frames, floor))
            if self._kind == "ave":
                count = self._timing.window_count(self._mel_count)
                self._add_windows(count)
                self._encode(0, count - 1)
                # The extended list repeats the last feature once.
                self._rows = np.concatenate((self._rows, self._rows[-1:]))
            frames = [self._frame(i, None) for i in range(self._next_frame, total)]
        self.reset()
        return frames

    @property
    def _mel_count(self) -> int:
        return self._mel_start + len(self._mel_frames)

    @property
    def _rows_end(self) -> int:
        return self._rows_start + len(self._rows)

    def _mel_window(self, m: int) -> FloatArray:
        """Mel window ``m`` as ``[1,80,16]``, clamped to the last 16 frames at the end."""
        start = min(self._timing.window_start(m), self._mel_count - MEL_WINDOW)
        rows = self._mel_frames[start - self._mel_start : start - self._mel_start + MEL_WINDOW]
        return np.ascontiguousarray(rows.T[np.newaxis])

    def _add_windows(self, stop: int) -> None:
        """Windows ``_ready_windows .. stop−1`` are ready: one batch, rows not yet encoded."""
        first = self._ready_windows
        if stop <= first:
            return
        new_rows = stop - first + (1 if first == 0 else 0)  # row 0 repeats window 0
        self._rows = np.concatenate(
            (self._rows, np.zeros((new_rows, ENCODER_FEATURES), dtype=np.float32))
        )
        self._batches.append((first, stop))
        self._ready_windows = stop

    def _encode(self, lo: int, hi: int) -> None:
        """Encode every batch of ready windows that holds one of windows ``lo .. hi``."""
        if self._encoder is None or hi < lo:
            return
        keep: deque[tuple[int, int]] = deque()
        for first, stop in self._batches:
            if stop <= lo or first > hi:
                keep.append((first, stop))
                continue
            batch = np.stack([self._mel_window(m) for m in range(first, stop)])
            features = self._encoder.encode(batch)
            self._windows_encoded += stop - first
            # Window w is row w+1; rows before _rows_start no frame to come uses.
            row = first + 1 - self._rows_start
            skip = max(0, -row)
            self._rows[row + skip : row + stop - first] = features[skip:]
            if first == 0 and self._rows_start == 0:  # extended row 0 repeats window 0
                self._rows[0] = features[0]
        self._batches = keep

    def _encode_likely(self, gate: FrameGate) -> None:
        """Encode the ready windows of frames ``gate`` will likely infer (its doc)."""
        level_from = self._next_frame + len(self._levels)
        while self._timing.level_span(level_from)[1] <= self._n_samples:
            level = self._level_db(level_from)
            self._levels.append(level)
            if level >= gate.threshold_db:
                # Frame j uses windows j−9 … j+R−1, and so do the frames after it.
                lo = max(level_from - CONTEXT_LEFT - 1, 0)
                hi = level_from + gate.frames_after + self._right_context - 1
                if lo > self._likely[1] + 1:
                    self._likely = (lo, hi)
                else:
                    self._likely = (self._likely[0], max(self._likely[1], hi))
            level_from += 1
        lo, hi = self._likely
        if hi >= lo:
            self._encode(lo, min(hi, self._ready_windows - 1))

    def _emit_ready(self, gate: FrameGate | None) -> list[FrameAudio]:
        frames: list[FrameAudio] = []
        while self._ready(self._next_frame):
            frames.append(self._frame(self._next_frame, gate))
        return frames

    def _ready(self, i: int) -> bool:
        if self._timing.level_span(i)[1] > self._n_samples:
            return False
        if self._kind == "ave":
            return self._rows_end > i + self._right_context
        return self._timing.window_start(i) + MEL_WINDOW <= self._mel_count

    def _frame(self, i: int, gate: FrameGate | None) -> FrameAudio:
        level = self._levels.popleft() if self._levels else self._level_db(i)
        self._next_frame = i + 1
        if gate is not None and not gate.infer(i, level):
            return FrameAudio(index=i, features=NO_FEATURES, level_db=level)
        if self._kind == "ave":
            features = self._context(i)
        else:
            features = self._mel_window(i)
        return FrameAudio(index=i, features=features, level_db=level)

    def _context(self, i: int) -> FloatArray:
        """Extended rows ``i−8 … i+R`` as ``[32,16,16]``; zeros where there is no row."""
        view = np.zeros((CONTEXT_ROWS, ENCODER_FEATURES), dtype=np.float32)
        first = i - CONTEXT_LEFT
        lo = max(first, 0)
        hi = min(i + self._right_context, self._rows_end - 1)
        if hi >= lo:
            self._encode(max(lo - 1, 0), hi - 1)  # rows lo … hi are windows lo−1 … hi−1
            view[lo - first : hi - first + 1] = self._rows[
                lo - self._rows_start : hi - self._rows_start + 1
            ]
        return view.reshape(AVE_SHAPE)

    def _level_db(self, i: int) -> float:
        start, end = self._timing.level_span(i)
        start, end = max(start, 0), min(end, self._n_samples)
        span = self._pcm[start - self._pcm_start : end - self._pcm_start].astype(np.float64)
        if span.size == 0:
            return SILENCE_DB
        mean_square = float(np.mean(span * span))
        if mean_square <= 0.0:
            return SILENCE_DB
        return max(SILENCE_DB, 10.0 * math.log10(mean_square))

    def _drop_consumed(self) -> None:
        timing = self._timing
        pcm_from = max(timing.span(self._next_frame)[0], 0)
        if pcm_from > self._pcm_start:
            self._pcm = self._pcm[pcm_from - self._pcm_start :]
            self._pcm_start = pcm_from
        # Batches no frame to come uses (windows before the next frame's first) are
        # never encoded.
        first_used = self._next_frame - CONTEXT_LEFT - 1
        while self._batches and self._batches[0][1] <= first_used:
            self._batches.popleft()
        # Mel frames: the first window not encoded, and the last 16 for a clamped end.
        next_window = self._batches[0][0] if self._batches else self._ready_windows
        if self._kind != "ave":
            next_window = self._next_frame
        mel_from = min(timing.window_start(next_window), self._mel_count - MEL_WINDOW)
        if mel_from > self._mel_start:
            self._mel_frames = self._mel_frames[mel_from - self._mel_start :]
            self._mel_start = mel_from
        # Rows: the next frame's left context, and the last row, repeated at flush.
        rows_from = min(self._next_frame - CONTEXT_LEFT, self._rows_end - 1)
        if rows_from > self._rows_start:
            self._rows = self._rows[rows_from - self._rows_start :]
            self._rows_start = rows_from


def _as_float32(pcm: npt.ArrayLike) -> FloatArray:
    samples = np.asarray(pcm)
    if samples.ndim != 1:
        raise ModelInputError(
            f"expected 1-D mono PCM, got shape {list(samples.shape)}: downmix first"
        )
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / np.float32(32768.0)
    if samples.dtype.kind == "f":
        return samples.astype(np.float32, copy=False)
    raise ModelInputError(f"expected float32 samples in [-1, 1] or int16 PCM, got {samples.dtype}")


def offline_features(
    samples: npt.ArrayLike,
    encoder: AudioEncoder | None,
    *,
    kind: FeatureKind = "ave",
    fps: int = 25,
    right_context: int = MAX_RIGHT_CONTEXT,
) -> list[FrameAudio]:
    """Features of every frame of a whole signal: one stream, ``push(all) + flush()``."""
    stream = AudioFeatureStream(encoder, kind=kind, fps=fps, right_context=right_context)
    return stream.push(samples) + stream.flush()
