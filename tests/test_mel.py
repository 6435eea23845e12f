"""The "ave" mel spectrogram: librosa-exact, and streaming equals offline bit for bit."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import scipy.signal  # type: ignore[import-untyped]

from inference_core.features.mel import MelConfig, StreamingMel, mel_filterbank, melspectrogram


def librosa_reference(samples: np.ndarray) -> np.ndarray:
    """The upstream recipe, written with librosa and scipy: ``[T, 80]``."""
    emphasised = scipy.signal.lfilter([1.0, -0.97], [1.0], samples)
    spec = np.abs(
        librosa.stft(
            emphasised, n_fft=800, hop_length=200, win_length=800, center=True, pad_mode="reflect"
        )
    )
    basis = librosa.filters.mel(sr=16000, n_fft=800, n_mels=80, fmin=55, fmax=7600)
    db = 20.0 * np.log10(np.maximum(1e-5, basis @ spec)) - 20.0
    ref: np.ndarray = np.clip(8.0 * (db + 100.0) / 100.0 - 4.0, -4.0, 4.0).T
    return ref


def stream_in_chunks(samples: np.ndarray, sizes: list[int]) -> np.ndarray:
    stream = StreamingMel()
    parts = []
    start = 0
    for size in sizes:
        parts.append(stream.push(samples[start : start + size]))
        start += size
    assert start >= len(samples), "chunk sizes must cover the signal"
    parts.append(stream.flush())
    return np.concatenate(parts)


def random_sizes(n: int, rng: np.random.Generator, high: int) -> list[int]:
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(int(rng.integers(1, high)))
    return sizes


def test_filterbank_matches_librosa() -> None:
    ours = mel_filterbank(MelConfig())
    ref = librosa.filters.mel(sr=16000, n_fft=800, n_mels=80, fmin=55, fmax=7600)
    assert ours.shape == (80, 401)
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6)


def test_melspectrogram_matches_librosa_on_speech(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    samples, _ = speech_16k
    mel = melspectrogram(samples)
    ref = librosa_reference(samples)
    assert mel.dtype == np.float32
    assert mel.shape == (1 + len(samples) // 200, 80) == ref.shape
    assert np.abs(mel - ref).max() <= 1e-4
    # The comparison is not vacuous: the speech spans the whole normalised range.
    assert mel.min() == -4.0
    assert mel.max() > 0.0


@pytest.mark.filterwarnings("ignore:n_fft=800 is too large:UserWarning")
@pytest.mark.parametrize("n", [2, 150, 399, 400, 401, 599, 600, 601, 1000])
def test_short_inputs_match_librosa(n: int) -> None:
    samples = (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    mel = melspectrogram(samples)
    ref = librosa_reference(samples)
    assert mel.shape == ref.shape == (1 + n // 200, 80)
    assert np.abs(mel - ref).max() <= 1e-4


def test_empty_and_single_sample_inputs() -> None:
    assert melspectrogram(np.zeros(0, dtype=np.float32)).shape == (0, 80)
    single = melspectrogram(np.array([0.5], dtype=np.float32))
    assert single.shape == (1, 80)
    assert np.isfinite(single).all()


def test_streaming_20ms_chunks_equals_offline(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    samples, _ = speech_16k
    offline = melspectrogram(samples)
    streamed = stream_in_chunks(samples, [320] * (len(samples) // 320 + 1))
    np.testing.assert_array_equal(streamed, offline)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_random_chunks_equals_offline(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]], seed: int
) -> None:
    samples, _ = speech_16k
    rng = np.random.default_rng(seed)
    offline = melspectrogram(samples)
    streamed = stream_in_chunks(samples, random_sizes(len(samples), rng, 1500))
    np.testing.assert_array_equal(streamed, offline)


@pytest.mark.parametrize("n", [1, 7, 333, 400, 401, 777, 4001])
def test_streaming_odd_chunks_on_short_signals_equals_offline(n: int) -> None:
    samples = (np.random.default_rng(n).standard_normal(n) * 0.2).astype(np.float32)
    offline = melspectrogram(samples)
    for size in (1, 3, 199, 401):
        np.testing.assert_array_equal(stream_in_chunks(samples, [size] * (n // size + 1)), offline)


def test_frames_come_out_as_soon_as_complete() -> None:
    samples = (np.random.default_rng(5).standard_normal(8000) * 0.1).astype(np.float32)
    stream = StreamingMel()
    for k in range(1, len(samples) + 1, 37):
        stream.push(samples[stream.samples_pushed : k])
        # Frame t needs samples up to 200t + 400; frame 0 reflects sample 400 (401 needed).
        expected = sum(1 for t in range(100) if max(200 * t + 400, 401) <= k)
        assert stream.frames_emitted == expected, k
    stream.push(samples[stream.samples_pushed :])
    total = stream.frames_emitted + len(stream.flush())
    assert total == 1 + len(samples) // 200


def test_buffer_stays_bounded_and_flush_starts_a_new_stream() -> None:
    rng = np.random.default_rng(9)
    samples = (rng.standard_normal(16000 * 20) * 0.1).astype(np.float32)
    stream = StreamingMel()
    largest = 0
    for start in range(0, len(samples), 320):
        stream.push(samples[start : start + 320])
        largest = max(largest, stream.buffered_samples)
    assert largest <= 800 + 320
    stream.flush()
    assert stream.buffered_samples == 0
    assert stream.frames_emitted == 0
    again = np.concatenate((stream.push(samples[:5000]), stream.flush()))
    np.testing.assert_array_equal(again, melspectrogram(samples[:5000]))


def test_config_rejects_unusable_values() -> None:
    with pytest.raises(ValueError, match="win must equal n_fft"):
        MelConfig(win=400)
    with pytest.raises(ValueError, match="fmax"):
        MelConfig(fmax=9000.0)


def test_streaming_keeps_the_tail_when_hop_exceeds_half_window() -> None:
    # With hop > n_fft/2 the last pad+1 samples (read by the right reflect padding at
    # flush) can lie before the next frame's start; they must not be dropped.
    cfg = MelConfig(hop=600)
    # A length that is a multiple of hop: the last frame starts right at the end of the
    # signal and mirrors the sample just before it.
    samples = (np.random.default_rng(4).standard_normal(9000) * 0.1).astype(np.float32)
    offline = melspectrogram(samples, cfg)
    assert offline.shape == (1 + 9000 // 600, 80)
    for size in (320, 777):
        stream = StreamingMel(cfg)
        parts = [stream.push(samples[s : s + size]) for s in range(0, len(samples), size)]
        np.testing.assert_array_equal(np.concatenate([*parts, stream.flush()]), offline)


class CountingMel(StreamingMel):
    """Counts the frames that go through the FFT and the filterbank."""

    transformed = 0

    def _transform(self, frames: np.ndarray) -> np.ndarray:
        self.transformed += len(frames)
        return super()._transform(frames)


def test_digital_silence_is_not_transformed_and_gives_the_same_frames(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    speech, _ = speech_16k
    gap = np.zeros(16000, dtype=np.float32)
    samples = np.concatenate((gap, speech[:16000], gap, speech[16000:32000], gap))
    stream = CountingMel()
    stream.transformed = 0  # (the silent row, transformed once when it is made)
    frames = []
    for start in range(0, len(samples), 320):
        frames.append(stream.push(samples[start : start + 320]))
    frames.append(stream.flush())
    streamed = np.concatenate(frames)
    # Each frame transformed on its own, as every frame was before silence was skipped.
    padded = np.pad(scipy.signal.lfilter([1.0, -0.97], [1.0], samples), 400, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 800)[::200]
    assert len(windows) == len(streamed)
    sound = windows.any(axis=1)
    assert (~sound).sum() > 3 * 70  # three gaps of ~78 silent frames each
    # Bit for bit what transforming every frame gives (the spectrogram before the
    # shortcut), and silence's row is the floor.
    np.testing.assert_array_equal(streamed, StreamingMel()._transform(windows))
    np.testing.assert_array_equal(streamed, melspectrogram(samples))
    np.testing.assert_array_equal(streamed[~sound], np.full(((~sound).sum(), 80), -4.0))
    assert stream.transformed == sound.sum()
