"""Decode any audio file PyAV can read into the two forms the pipeline needs.

16 kHz mono float32 (:data:`~streaming.audio_rates.FEATURE_RATE`) feeds the audio
features; a 48 kHz copy (mono or stereo, as the source) is what goes back out to the
listener, so output audio keeps its quality. This is the offline render's decoder; audio
a live session gets is decoded to 48 kHz only (:mod:`~streaming.audio_in.push`,
``docs/design/audio-in.md`` §2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from streaming.audio_in.exceptions import AudioInputError
from streaming.audio_rates import FEATURE_RATE, OUT_RATE


@dataclass(frozen=True)
class DecodedAudio:
    """A whole decoded audio file."""

    pcm_16k: np.ndarray  # float32 mono in [-1, 1], FEATURE_RATE
    pcm_out: np.ndarray  # float32 planar [channels, n] at out_rate
    out_rate: int
    layout: str  # "mono" or "stereo"
    source_rate: int
    source_channels: int

    @property
    def duration_s(self) -> float:
        return len(self.pcm_16k) / FEATURE_RATE


def _planar(frames: list[av.AudioFrame], channels: int, scale: float) -> np.ndarray:
    if not frames:
        return np.zeros((channels, 0), dtype=np.float32)
    arrays = [f.to_ndarray().reshape(channels, -1) for f in frames]
    return (np.concatenate(arrays, axis=1).astype(np.float32) * scale).astype(np.float32)


def decode_audio(path: Path, *, out_rate: int = OUT_RATE) -> DecodedAudio:
    """Decode ``path`` (any rate, any channel count, any container PyAV reads).

    Raises :class:`AudioInputError` when the file is missing, unreadable or has no audio.
    """
    if not path.is_file():
        raise AudioInputError(f"audio file {path} does not exist")
    try:
        container = av.open(str(path))
    except av.error.FFmpegError as exc:
        raise AudioInputError(f"cannot read {path} as audio: {exc}") from exc
    with container:
        if not container.streams.audio:
            raise AudioInputError(f"{path} has no audio stream")
        stream = container.streams.audio[0]
        source_channels = stream.codec_context.channels or 1
        layout = "mono" if source_channels == 1 else "stereo"
        to_16k = av.AudioResampler(format="s16", layout="mono", rate=FEATURE_RATE)
        to_out = av.AudioResampler(format="fltp", layout=layout, rate=out_rate)
        feats: list[av.AudioFrame] = []
        outs: list[av.AudioFrame] = []
        try:
            for frame in container.decode(stream):
                # Order matters: a pass-through resampler (16 kHz mono s16 input) hands
                # back the frame after altering it, which the other resampler then refuses.
                outs += to_out.resample(frame)
                feats += to_16k.resample(frame)
            feats += to_16k.resample(None)
            outs += to_out.resample(None)
        except av.error.FFmpegError as exc:
            raise AudioInputError(f"cannot decode audio in {path}: {exc}") from exc
        source_rate = stream.codec_context.sample_rate or 0
    pcm_16k = _planar(feats, 1, 1.0 / 32768.0)[0]
    if len(pcm_16k) == 0:
        raise AudioInputError(f"{path} holds no audio samples")
    channels = 1 if layout == "mono" else 2
    return DecodedAudio(
        pcm_16k, _planar(outs, channels, 1.0), out_rate, layout, source_rate, source_channels
    )
