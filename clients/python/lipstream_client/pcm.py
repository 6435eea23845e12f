"""Mono PCM as the server reads it: little-endian ``s16le`` or ``f32le`` bytes."""

from __future__ import annotations

from typing import Literal

import numpy as np

PcmFormat = Literal["s16le", "f32le"]

#: Bytes per sample of each format.
SAMPLE_BYTES: dict[str, int] = {"s16le": 2, "f32le": 4}
_DTYPES = {"s16le": "<i2", "f32le": "<f4"}
#: Sample rates the audio stream accepts (docs/apps.md).
STREAM_RATES = (16000, 22050, 24000, 44100, 48000)


def to_pcm_bytes(samples: np.ndarray, fmt: PcmFormat) -> bytes:
    """Mono ``samples`` (float in [-1, 1] or int16) as ``fmt`` bytes.

    Floats beyond full scale are clipped for ``s16le``; int16 is scaled by 1/32768 for
    ``f32le``. Raises :class:`ValueError` for anything but one channel of int16 or float.
    """
    array = np.asarray(samples)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise ValueError(f"expected mono samples (one dimension), got shape {array.shape}")
    if array.dtype == np.int16:
        out = array if fmt == "s16le" else array.astype(np.float32) / 32768.0
    elif np.issubdtype(array.dtype, np.floating):
        if fmt == "f32le":
            out = array
        else:
            out = np.round(np.clip(np.nan_to_num(array, nan=0.0), -1.0, 1.0) * 32767.0)
    else:
        raise ValueError(f"expected float or int16 samples, got {array.dtype}")
    data: bytes = out.astype(_DTYPES[fmt], copy=False).tobytes()
    return data


def pcm_format_for(samples: np.ndarray) -> PcmFormat:
    """The format that carries ``samples`` without loss: ``s16le`` for int16, else ``f32le``."""
    return "s16le" if np.asarray(samples).dtype == np.int16 else "f32le"


def split_pcm(data: bytes, sample_bytes: int, max_samples: int) -> list[bytes]:
    """``data`` in pieces of at most ``max_samples`` whole samples each.

    Raises :class:`ValueError` when ``data`` is not a whole number of samples.
    """
    if len(data) % sample_bytes:
        raise ValueError(f"{len(data)} bytes is not a whole number of {sample_bytes}-byte samples")
    step = max_samples * sample_bytes
    return [data[i : i + step] for i in range(0, len(data), step)]
