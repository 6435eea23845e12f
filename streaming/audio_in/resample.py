"""Sample-rate conversion of float32 mono audio with FFmpeg's resampler (PyAV)."""

from __future__ import annotations

import av
import numpy as np


class MonoResampler:
    """Streaming float32 mono resampler: feed chunks, get the converted samples so far.

    Keeps FFmpeg's filter state between chunks, so a stream resampled chunk by chunk has
    no seams. The output lags the input by the filter's few-sample delay until flushed.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=dst_rate)
        self._pts = 0

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Resample the next chunk; returns whatever output is ready (maybe empty)."""
        if len(samples) == 0:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = self.src_rate
        frame.pts = self._pts
        self._pts += len(samples)
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """The samples still held in the filter (call at the end of a stream)."""
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> np.ndarray:
        if not frames:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)


def resample_mono(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample a whole float32 mono buffer."""
    if src_rate == dst_rate:
        return np.asarray(samples, dtype=np.float32)
    resampler = MonoResampler(src_rate, dst_rate)
    return np.concatenate([resampler.push(samples), resampler.flush()])
