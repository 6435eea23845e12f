"""Sample-rate conversion of float32 mono audio with FFmpeg's resampler (PyAV)."""

from __future__ import annotations

import av
import numpy as np


class MonoResampler:
    """Streaming float32 mono resampler: feed chunks, get the converted samples so far.

    Keeps FFmpeg's filter state between chunks, so a stream resampled chunk by chunk has
    no seams. The output lags the input by the filter's few-sample delay until flushed.

    Digital silence after digital silence is not resampled: once a chunk of zeros came
    out as zeros, the filter holds nothing but zeros, so the next chunk of zeros (of a
    length the ratio divides) comes out as zeros of its exact length without FFmpeg, and
    leaves the filter as it was (a listening call's 20 ms chunks, issue 26).
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._resampler: av.AudioResampler | None = av.AudioResampler(
            format="flt", layout="mono", rate=dst_rate
        )
        self._pts = 0
        self._quiet = False  # the last chunk was zeros in and zeros out
        self.skipped = 0  # chunks of silence not handed to FFmpeg

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Resample the next chunk; returns whatever output is ready (maybe empty)."""
        if len(samples) == 0:
            return np.zeros(0, dtype=np.float32)
        silent = not np.any(samples)
        out_len, rest = divmod(len(samples) * self.dst_rate, self.src_rate)
        if silent and self._quiet and rest == 0:
            self.skipped += 1
            return np.zeros(out_len, dtype=np.float32)
        out = self._resample(samples)
        self._quiet = silent and rest == 0 and len(out) == out_len and not np.any(out)
        return out

    def _resample(self, samples: np.ndarray) -> np.ndarray:
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = self.src_rate
        frame.pts = self._pts
        self._pts += len(samples)
        return self._collect(self._filter().resample(frame))

    def flush(self) -> np.ndarray:
        """The samples still held in the filter (call at the end of a stream)."""
        return self._collect(self._filter().resample(None))

    def close(self) -> None:
        """Free FFmpeg's filter graph now, with the two threads it runs on; resampling
        after this raises. Left to Python, a resampler held in a reference cycle (a
        call's timeline is one) goes only at the cycle collector's next full collection,
        which a long-lived server, with its many old objects, makes seldom."""
        self._resampler = None

    def _filter(self) -> av.AudioResampler:
        if self._resampler is None:
            raise RuntimeError("this resampler is closed")
        return self._resampler

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
