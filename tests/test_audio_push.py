"""Pushed audio: files and raw PCM of any rate and channel count become 48 kHz mono, the
mixer's rate, with their whole band (``docs/design/audio-in.md`` §2)."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

from config.settings import SessionSettings
from streaming.audio_in.exceptions import AudioInputError, AudioTooLargeError
from streaming.audio_in.push import (
    AudioLimits,
    decode_pushed_audio,
    parse_content_type,
    sniff_audio_type,
)
from streaming.audio_rates import OUT_RATE
from tests.media import write_wav

RATE = OUT_RATE  # what pushed audio is decoded to
TOLERANCE_S = 0.020


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(pcm: np.ndarray, rate: int = RATE) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.fft.rfftfreq(len(pcm), 1.0 / rate)[int(np.argmax(spectrum))])


def assert_tone(pcm: np.ndarray, freq: float, seconds: float) -> None:
    assert pcm.dtype == np.float32
    assert pcm.ndim == 1
    assert abs(len(pcm) / RATE - seconds) <= TOLERANCE_S, len(pcm) / RATE
    assert np.abs(pcm).max() <= 1.0
    assert abs(peak_hz(pcm) - freq) < 5.0
    assert np.sqrt(np.mean(pcm**2)) > 0.2  # a 0.5 sine has rms 0.35: not attenuated away


def wav_bytes(tmp_path: Path, pcm: np.ndarray, rate: int, channels: int = 1) -> bytes:
    return write_wav(tmp_path / "in.wav", pcm, rate, channels).read_bytes()


def encode_with_pyav(
    pcm: np.ndarray, rate: int, container_format: str, codec: str, sample_format: str
) -> bytes:
    """Encode mono float ``pcm`` into an in-memory file, as an app's recorder would."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container_format) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        stream.format = sample_format
        frame_size = stream.codec_context.frame_size or 1024
        for start in range(0, len(pcm), frame_size):
            piece = pcm[start : start + frame_size]
            if sample_format.startswith("s16"):
                piece = (piece * 32767).astype(np.int16)
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(piece.reshape(1, -1)), format=sample_format, layout="mono"
            )
            frame.sample_rate = rate
            frame.pts = start
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


# --- files -------------------------------------------------------------------------


def test_wav_22050_stereo_is_mixed_to_48k_mono(tmp_path: Path) -> None:
    mono = tone(440.0, 22_050, 1.5)
    stereo = np.stack([mono, mono], axis=1).reshape(-1)  # interleaved L R
    pcm = decode_pushed_audio(wav_bytes(tmp_path, stereo, 22_050, 2), "audio/wav", {})
    assert_tone(pcm, 440.0, 1.5)


def test_wav_8k_mono_is_upsampled(tmp_path: Path) -> None:
    pcm = decode_pushed_audio(
        wav_bytes(tmp_path, tone(300.0, 8_000, 1.0), 8_000), "audio/x-wav", {}
    )
    assert_tone(pcm, 300.0, 1.0)


def test_wav_at_48k_matches_the_source(tmp_path: Path) -> None:
    source = tone(1000.0, RATE, 0.5)
    pcm = decode_pushed_audio(wav_bytes(tmp_path, source, RATE), "audio/wave", {})
    assert len(pcm) == len(source)
    np.testing.assert_allclose(pcm, source, atol=1e-4)


def test_float_wav_at_48k_mono_passes_through_the_resampler() -> None:
    # Already flt mono 48 kHz: PyAV's resampler hands back the input frame itself.
    source = tone(500.0, RATE, 0.8)
    body = encode_with_pyav(source, RATE, "wav", "pcm_f32le", "flt")
    pcm = decode_pushed_audio(body, "audio/wav", {})
    np.testing.assert_allclose(pcm, source, atol=1e-6)


def test_mp3_made_with_pyav() -> None:
    body = encode_with_pyav(tone(440.0, 44_100, 2.0), 44_100, "mp3", "libmp3lame", "s16p")
    assert sniff_audio_type(body) == "audio/mpeg"
    pcm = decode_pushed_audio(body, "audio/mpeg", {})
    assert_tone(pcm, 440.0, 2.0)


def test_ogg_opus_made_with_pyav() -> None:
    body = encode_with_pyav(tone(660.0, 48_000, 1.0), 48_000, "ogg", "libopus", "s16")
    assert sniff_audio_type(body) == "audio/ogg"
    pcm = decode_pushed_audio(body, "audio/ogg; codecs=opus", {})
    assert_tone(pcm, 660.0, 1.0)


def test_flac_made_with_pyav() -> None:
    body = encode_with_pyav(tone(250.0, 32_000, 1.2), 32_000, "flac", "flac", "s16")
    assert sniff_audio_type(body) == "audio/flac"
    assert_tone(decode_pushed_audio(body, "audio/flac", {}), 250.0, 1.2)


# --- raw PCM -----------------------------------------------------------------------


def test_raw_s16le_with_query_params() -> None:
    source = tone(440.0, 48_000, 1.0)
    stereo = np.stack([source, source], axis=1).reshape(-1)
    body = (stereo * 32767).astype("<i2").tobytes()
    params = {"format": "s16le", "rate": "48000", "channels": "2"}
    pcm = decode_pushed_audio(body, "application/octet-stream", params)
    assert_tone(pcm, 440.0, 1.0)


def test_raw_s16le_at_48k_is_the_source_sample_for_sample() -> None:
    source = tone(800.0, RATE, 0.25)
    body = (source * 32768).astype("<i2").tobytes()
    params = {"format": "s16le", "rate": "48000", "channels": "1"}
    pcm = decode_pushed_audio(body, "audio/pcm", params)
    np.testing.assert_allclose(pcm, source, atol=1.0 / 32768)


def test_l16_is_big_endian() -> None:
    source = tone(440.0, 48_000, 1.0)
    body = (source * 32767).astype(">i2").tobytes()
    pcm = decode_pushed_audio(body, "audio/L16; rate=48000", {})
    np.testing.assert_allclose(pcm, source, atol=1e-4)
    # Read as little-endian the same bytes are noise, so the byte order really is used.
    wrong = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768
    assert abs(np.corrcoef(wrong, source)[0, 1]) < 0.2


def test_l16_stereo_at_44100() -> None:
    source = tone(440.0, 44_100, 1.0)
    body = (np.stack([source, source], axis=1).reshape(-1) * 32767).astype(">i2").tobytes()
    pcm = decode_pushed_audio(body, 'audio/L16;rate="44100";channels=2', {})
    assert_tone(pcm, 440.0, 1.0)


def test_raw_f32le() -> None:
    source = tone(350.0, 24_000, 1.0)
    params = {"format": "f32le", "rate": "24000", "channels": "1"}
    pcm = decode_pushed_audio(source.astype("<f4").tobytes(), "application/octet-stream", params)
    assert_tone(pcm, 350.0, 1.0)
    resampled_back = np.interp(np.arange(len(source)) * (RATE / 24_000), np.arange(len(pcm)), pcm)
    assert np.corrcoef(resampled_back[100:-100], source[100:-100])[0, 1] > 0.99


def test_raw_f32le_out_of_range_values_are_clipped() -> None:
    body = np.array([2.0, -3.0, np.inf, np.nan], dtype="<f4").tobytes()
    params = {"format": "f32le", "rate": "48000", "channels": "1"}  # no resampling
    pcm = decode_pushed_audio(body, "audio/pcm", params)
    np.testing.assert_array_equal(pcm, [1.0, -1.0, 1.0, 0.0])


# --- errors ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["audio/wav", "audio/mpeg", "audio/ogg", "audio/flac"])
def test_garbage_body_is_an_audio_error(content_type: str) -> None:
    with pytest.raises(AudioInputError, match=r"cannot decode|no audio") as info:
        decode_pushed_audio(b"this is not audio at all " * 40, content_type, {})
    assert not isinstance(info.value, AudioTooLargeError)


def test_unsupported_content_type_lists_the_supported_ones() -> None:
    with pytest.raises(
        AudioInputError, match="unsupported audio content type 'text/plain'"
    ) as info:
        decode_pushed_audio(b"hello", "text/plain; charset=utf-8", {})
    for supported in ("audio/wav", "audio/mpeg", "audio/L16", "application/octet-stream"):
        assert supported in str(info.value)


@pytest.mark.parametrize(
    ("params", "missing"),
    [
        ({"format": "s16le", "channels": "1"}, "rate"),
        ({"rate": "16000", "channels": "1"}, "format"),
        ({"format": "s16le", "rate": "16000"}, "channels"),
    ],
)
def test_raw_pcm_names_the_missing_parameter(params: dict[str, str], missing: str) -> None:
    with pytest.raises(AudioInputError, match=f"needs the '{missing}' parameter"):
        decode_pushed_audio(b"\0\0" * 100, "application/octet-stream", params)


def test_l16_without_rate_names_it() -> None:
    with pytest.raises(AudioInputError, match="needs the 'rate' parameter"):
        decode_pushed_audio(b"\0\0" * 100, "audio/L16", {})


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"format": "s16le", "rate": "fast", "channels": "1"}, "rate='fast' is not valid"),
        ({"format": "s16le", "rate": "100", "channels": "1"}, "rate='100' is not valid"),
        ({"format": "s16le", "rate": "16000", "channels": "0"}, "channels='0' is not valid"),
        ({"format": "u8", "rate": "16000", "channels": "1"}, "format='u8' is not supported"),
    ],
)
def test_bad_raw_parameters_are_refused(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(AudioInputError, match=fragment):
        decode_pushed_audio(b"\0\0" * 100, "audio/pcm", params)


def test_odd_byte_count_for_s16() -> None:
    params = {"format": "s16le", "rate": "16000", "channels": "1"}
    with pytest.raises(AudioInputError, match="multiple of 2 bytes; the body has 201"):
        decode_pushed_audio(b"\0" * 201, "audio/pcm", params)


def test_empty_body() -> None:
    with pytest.raises(AudioInputError, match="empty"):
        decode_pushed_audio(b"", "audio/wav", {})


def test_too_many_bytes_is_a_413_error_naming_the_limit() -> None:
    limits = AudioLimits(max_bytes=1000)
    params = {"format": "s16le", "rate": "16000", "channels": "1"}
    with pytest.raises(AudioTooLargeError, match="at most 1000 bytes"):
        decode_pushed_audio(b"\0\0" * 501, "audio/pcm", params, limits=limits)
    # The check on its own, for a Content-Length before the body is read.
    with pytest.raises(AudioTooLargeError, match=r"session\.max_audio_push_bytes"):
        limits.check_bytes(1001)
    limits.check_bytes(1000)


def test_too_many_seconds_of_raw_pcm() -> None:
    limits = AudioLimits(max_bytes=10**9, max_seconds=1.0)
    params = {"format": "s16le", "rate": "16000", "channels": "1"}
    with pytest.raises(AudioTooLargeError, match="longer than 1 s"):
        decode_pushed_audio(b"\0\0" * 16_001, "audio/pcm", params, limits=limits)


def test_compressed_body_over_the_seconds_limit_is_stopped() -> None:
    # 5 s of silence compresses to a few hundred bytes of FLAC: the byte limit cannot
    # catch it, the decoded-seconds limit must.
    body = encode_with_pyav(np.zeros(5 * RATE, np.float32), RATE, "flac", "flac", "s16")
    limits = AudioLimits(max_bytes=len(body), max_seconds=2.0)
    with pytest.raises(AudioTooLargeError, match="longer than 2 s"):
        decode_pushed_audio(body, "audio/flac", {}, limits=limits)


def test_limits_from_settings() -> None:
    limits = AudioLimits.from_settings(SessionSettings(max_audio_push_bytes="1KiB"))
    assert limits.max_bytes == 1024


def test_parse_content_type() -> None:
    assert parse_content_type('Audio/L16; Rate="8000" ;channels=2') == (
        "audio/l16",
        {"rate": "8000", "channels": "2"},
    )
    assert parse_content_type("") == ("", {})


def test_sniff_wav_and_unknown(tmp_path: Path) -> None:
    assert sniff_audio_type(wav_bytes(tmp_path, tone(440.0, RATE, 0.1), RATE)) == "audio/wav"
    assert sniff_audio_type(b"hello") is None
