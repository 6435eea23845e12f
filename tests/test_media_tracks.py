"""The outbound tracks' media: Opus packets stamped on the session timeline."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.tracks import OpusChunkEncoder


def sine(index: int, hz: float = 440.0) -> np.ndarray:
    t = (np.arange(CHUNK_SAMPLES) + index * CHUNK_SAMPLES) / OUT_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_opus_packets_carry_the_timeline_and_decode_to_the_same_tone() -> None:
    encoder = OpusChunkEncoder()
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = OUT_RATE
    decoder.layout = "stereo"  # what a WebRTC peer asks of "opus/48000/2"
    packed = av.AudioResampler(format="flt", layout="stereo", rate=OUT_RATE)
    decoded: list[np.ndarray] = []
    for index in range(50):
        packet = encoder.encode(sine(index), index + 1000)
        assert packet.pts == (index + 1000) * CHUNK_SAMPLES
        assert packet.time_base == Fraction(1, OUT_RATE)
        assert 0 < packet.size < 400  # ≈48 kbit/s: 120 bytes per 20 ms
        for frame in decoder.decode(packet):
            decoded.extend(f.to_ndarray().reshape(-1)[::2] for f in packed.resample(frame))  # left
    pcm = np.concatenate(decoded).astype(np.float64)
    steady = pcm[OUT_RATE // 2 :]  # past the codec's start-up
    spectrum = np.abs(np.fft.rfft(steady * np.hanning(len(steady))))
    peak_hz = np.argmax(spectrum) * OUT_RATE / len(steady)
    assert abs(peak_hz - 440.0) < 5.0
    amplitude = np.sqrt(np.mean(steady**2)) * np.sqrt(2)
    assert 0.3 < amplitude < 0.7, amplitude  # 0.5 sent


def test_a_chunk_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="960 samples"):
        OpusChunkEncoder().encode(np.zeros(480, np.float32), 0)


def test_the_voice_comes_back_within_3_ms_of_codec_delay() -> None:
    # A tone starting at chunk 5: its onset in the decoded audio shows the codec's delay
    # (6.4 ms for Opus's "voip" mode, 2.5 ms for the "lowdelay" mode we send with).
    encoder = OpusChunkEncoder()
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = OUT_RATE
    decoder.layout = "mono"
    decoded: list[np.ndarray] = []
    for index in range(10):
        chunk = sine(index) if index >= 5 else np.zeros(CHUNK_SAMPLES, np.float32)
        for frame in decoder.decode(encoder.encode(chunk, index)):
            samples = frame.to_ndarray().reshape(-1)
            scale = 32768.0 if samples.dtype == np.int16 else 1.0
            decoded.append(samples.astype(np.float64) / scale)
    pcm = np.concatenate(decoded)
    onset = int(np.argmax(np.abs(pcm) > 0.1))
    delay_ms = (onset - 5 * CHUNK_SAMPLES) * 1000 / OUT_RATE
    assert 0 <= delay_ms <= 3.0, delay_ms
