"""The outbound tracks' media: Opus packets stamped on the session timeline."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from streaming.webrtc.tracks import CHUNK_SAMPLES, OUT_RATE, OpusChunkEncoder


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
