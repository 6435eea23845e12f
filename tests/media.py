"""Test media made on the spot: speech from espeak-ng, silence, synthetic tones.

Tests never download anything; speech comes from espeak-ng (installed by ``.ci/run``).
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

SAMPLE_RATE = 16_000


def require_espeak() -> str:
    """Return the espeak-ng executable or fail with an install hint.

    A missing espeak-ng is a broken test environment, not a reason to skip:
    ``.ci/run`` installs it.
    """
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.fail("espeak-ng is not installed: run `apt-get install -y espeak-ng` (.ci/run does)")
    return exe


def espeak_wav(path: Path, text: str, *, rate_wpm: int = 150) -> Path:
    """Speak ``text`` into a WAV file at espeak-ng's native rate (22.05 kHz mono s16)."""
    subprocess.run(
        [require_espeak(), "-v", "en", "-s", str(rate_wpm), "-w", str(path), text],
        check=True,
        capture_output=True,
    )
    return path


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Read a mono or stereo s16 WAV as float32 in [-1, 1] (channels averaged) and its rate."""
    with wave.open(str(path), "rb") as w:
        rate = w.getframerate()
        channels = w.getnchannels()
        raw = w.readframes(w.getnframes())
    pcm = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1)
    return pcm, rate


def write_wav(path: Path, pcm: np.ndarray, rate: int = SAMPLE_RATE, channels: int = 1) -> Path:
    """Write float32 [-1, 1] samples (interleaved when ``channels`` > 1) as s16 WAV."""
    data = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data)
    return path


def resample_linear(pcm: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Plain linear resampling, good enough to feed test speech at 16 kHz."""
    if src_rate == dst_rate:
        return pcm.astype(np.float32)
    n_out = round(len(pcm) * dst_rate / src_rate)
    t = np.arange(n_out) * (src_rate / dst_rate)
    return np.interp(t, np.arange(len(pcm)), pcm).astype(np.float32)


def speech_with_pauses(
    tmp_dir: Path,
    phrases: tuple[str, ...] = ("hello there", "how are you today"),
    pause_s: float = 1.0,
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """16 kHz mono speech: silence, phrase, silence, phrase, silence.

    Returns the samples and the (start_s, end_s) span of each phrase, measured from
    where the spoken samples actually are (espeak-ng pads its output with a little silence).
    """
    pause = np.zeros(round(pause_s * SAMPLE_RATE), dtype=np.float32)
    parts: list[np.ndarray] = [pause]
    spans: list[tuple[float, float]] = []
    cursor = len(pause)
    for i, text in enumerate(phrases):
        pcm, rate = read_wav(espeak_wav(tmp_dir / f"phrase{i}.wav", text))
        pcm = resample_linear(pcm, rate, SAMPLE_RATE)
        loud = np.flatnonzero(np.abs(pcm) > 0.01)
        first, last = (int(loud[0]), int(loud[-1])) if len(loud) else (0, 0)
        spans.append(((cursor + first) / SAMPLE_RATE, (cursor + last) / SAMPLE_RATE))
        parts += [pcm, pause]
        cursor += len(pcm) + len(pause)
    return np.concatenate(parts), spans
