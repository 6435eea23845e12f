"""The outbound tracks' media: Opus packets stamped on the session timeline."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest

from streaming.audio_in.resample import MonoResampler, resample_mono
from streaming.audio_rates import CHUNK_SAMPLES, OUT_RATE
from streaming.webrtc.opus_decoder import OpusDecoder
from streaming.webrtc.tracks import SILENCE, OpusChunkEncoder, fec_percent


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


@pytest.fixture
def no_collection() -> Iterator[None]:
    """Python's cycle collector off: objects in a reference cycle stay, as they do in a
    long-lived server between its seldom full collections."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.usefixtures("no_collection")
def test_closing_frees_the_codecs_and_their_threads_even_in_a_reference_cycle() -> None:
    """A call's resampler and Opus encoder sit in the call's reference cycles: closed at
    its end, FFmpeg's filter graphs go at once, with the threads they run on."""
    before = _threads()
    resampler, encoder = MonoResampler(OUT_RATE, 16_000), OpusChunkEncoder()
    cycle: dict[str, object] = {"resampler": resampler, "encoder": encoder}
    cycle["itself"] = cycle
    resampler.push(sine(0))
    encoder.encode(sine(0), 0)
    started = _threads() - before  # the filter graphs' (none on a single core)
    resampler.close()
    encoder.close()
    assert not started & _threads(), "the codecs' threads outlived close()"
    with pytest.raises(RuntimeError, match="closed"):
        resampler.push(sine(1))
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode(sine(1), 1)


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


class EveryChunk(OpusChunkEncoder):
    """Encodes every chunk, silence too (what the encoder did before it skipped zeros)."""

    def encode(self, chunk: np.ndarray, index: int) -> av.Packet[Any]:
        return self._encode(chunk, index)


def decode_all(packets: list[av.Packet[Any]]) -> np.ndarray:
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = OUT_RATE
    decoder.layout = "mono"
    out = []
    for packet in packets:
        for frame in decoder.decode(av.Packet(bytes(packet))):
            samples = frame.to_ndarray().reshape(-1)
            scale = 32768.0 if samples.dtype == np.int16 else 1.0
            out.append(samples.astype(np.float64) / scale)
    return np.concatenate(out)


def silence_speech_silence(speech_48k: np.ndarray) -> list[np.ndarray]:
    """2 s of zeros, the speech, 2 s of zeros, the speech again, 1 s of zeros: 20 ms chunks."""
    zeros = np.zeros(OUT_RATE * 2, np.float32)
    whole = np.concatenate((zeros, speech_48k, zeros, speech_48k, zeros[:OUT_RATE]))
    whole = whole[: len(whole) // CHUNK_SAMPLES * CHUNK_SAMPLES]
    return list(whole.reshape(-1, CHUNK_SAMPLES))


def snr_db(signal: np.ndarray, error: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(signal**2) / np.mean(error**2)))


def test_digital_silence_is_not_encoded_and_the_voice_is_unchanged(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    speech, _ = speech_16k
    speech_48k = resample_mono(speech[: 16000 * 2], 16000, OUT_RATE)
    chunks = silence_speech_silence(speech_48k)
    skipping, every = OpusChunkEncoder(), EveryChunk()
    skipped = [skipping.encode(c, i) for i, c in enumerate(chunks)]
    encoded = [every.encode(c, i) for i, c in enumerate(chunks)]
    zero = np.array([not c.any() for c in chunks])
    assert zero.sum() > 300
    for i, packet in enumerate(skipped):
        assert packet.pts == i * CHUNK_SAMPLES
    # Most zero chunks are not encoded; those encoded are the codec's tail after sound.
    assert skipping.chunks_encoded + skipping.chunks_silent == len(chunks)
    assert skipping.chunks_silent > 0.8 * zero.sum()
    assert skipping.chunks_encoded < (~zero).sum() + 0.2 * zero.sum()
    # Where encoding every chunk gives the codec's own silence, so does skipping: the
    # tail after sound is encoded, and what follows it is that silence. (The tail's
    # bytes themselves differ after a skipped gap: constrained VBR banks the bits a
    # silence leaves unused, so the speech before it was coded with another budget.)
    for packet, reference, is_zero in zip(skipped, encoded, zero, strict=True):
        if is_zero and bytes(reference) == SILENCE:
            assert bytes(packet) == SILENCE
    # Speech after a skipped gap starts from a codec whose rate control did not see the
    # gap: it is coded with another budget, and sounds no worse for it (its error
    # against the original within 1 dB of encoding every chunk's).
    heard, reference_pcm = decode_all(skipped), decode_all(encoded)
    original = np.concatenate(chunks).astype(np.float64)
    delay = 120  # 2.5 ms of "lowdelay" codec delay
    n = len(reference_pcm) - delay
    codec_error = reference_pcm[delay:] - original[:n]
    skipped_error = heard[delay : delay + n] - original[:n]
    assert snr_db(original[:n], skipped_error) > snr_db(original[:n], codec_error) - 1.0
    # And once both streams send the codec's silence, what is heard is the same.
    silent = np.array(
        [bytes(a) == bytes(b) == SILENCE for a, b in zip(skipped, encoded, strict=True)]
    )
    assert silent.sum() > 0.7 * zero.sum()
    for chunk in (np.flatnonzero(silent[2:] & silent[1:-1] & silent[:-2]) + 2).tolist():
        gap = slice(chunk * CHUNK_SAMPLES + delay, (chunk + 1) * CHUNK_SAMPLES + delay)
        np.testing.assert_array_equal(heard[gap], reference_pcm[gap])


def test_a_listening_call_encodes_no_audio() -> None:
    encoder = OpusChunkEncoder()
    packets = [encoder.encode(np.zeros(CHUNK_SAMPLES, np.float32), i) for i in range(500)]
    assert encoder.chunks_encoded == 0
    assert encoder.chunks_silent == 500
    assert all(bytes(p) == SILENCE and p.pts == i * CHUNK_SAMPLES for i, p in enumerate(packets))


@pytest.mark.parametrize(
    ("loss", "percent"), [(0.0, 0), (0.009, 0), (0.02, 5), (0.07, 10), (0.5, 40)]
)
def test_the_loss_a_caller_reports_picks_the_fec_the_voice_carries(
    loss: float, percent: int
) -> None:
    assert fec_percent(loss) == percent


def test_a_voice_with_fec_carries_a_copy_of_each_speech_frame_in_the_next(
    speech_16k: tuple[np.ndarray, list[tuple[float, float]]],
) -> None:
    speech, _ = speech_16k
    pcm = resample_mono(speech[: 16000 * 2], 16000, OUT_RATE).astype(np.float32)
    chunks = pcm[: len(pcm) // CHUNK_SAMPLES * CHUNK_SAMPLES].reshape(-1, CHUNK_SAMPLES)
    plain, protected = OpusChunkEncoder(), OpusChunkEncoder(fec_percent=10)
    assert (plain.fec_percent, protected.fec_percent) == (0, 10)
    decoder = OpusDecoder()
    sizes = {"plain": 0, "protected": 0}
    with_fec = 0
    for index, chunk in enumerate(chunks):
        a, b = bytes(plain.encode(chunk, index)), bytes(protected.encode(chunk, index))
        sizes["plain"] += len(a)
        sizes["protected"] += len(b)
        assert a[0] >> 3 >= 16  # CELT only: no room for FEC, 2.5 ms of codec delay
        with_fec += bool(decoder.has_fec(b))
    loud = sum(float(np.abs(chunk).max()) > 0.05 for chunk in chunks)
    assert with_fec > 0.6 * loud  # SILK/hybrid frames with their predecessor's copy
    # the same 48 kbit/s budget (constrained VBR) with FEC as without
    assert sizes["protected"] <= 1.05 * sizes["plain"]
    assert sizes["plain"] * 8 / (len(chunks) * 0.02) < 52_000
