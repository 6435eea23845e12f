"""Audio that apps push into a live session over HTTP, decoded to 48 kHz mono float32.

48 kHz (:data:`~streaming.audio_rates.OUT_RATE`) is the mixer's rate and the rate of the
Opus stream the caller hears, so a body is resampled once, straight to it, and keeps its
whole band (up to 24 kHz); the features' 16 kHz is made later, by the session's timeline
(``docs/design/audio-in.md`` §2).

Two kinds of body are accepted:

* an audio file (WAV, MP3, Ogg, FLAC, WebM, MP4/M4A, AAC) of any rate and channel count;
* raw PCM: ``audio/L16`` (signed 16-bit big-endian, RFC 2586, ``rate`` and ``channels``
  in the content type) or ``application/octet-stream`` / ``audio/pcm`` with
  ``format=s16le|f32le``, ``rate`` and ``channels`` given as query (or content-type)
  parameters.

Files are opened with the demuxer the content type names, never by probing: probing an
uploaded body lets FFmpeg pick demuxers such as HLS that open further URLs or local files.

:func:`decode_pushed_audio` is synchronous and CPU-bound; callers on the event loop run
it with :func:`asyncio.to_thread`. Errors are :class:`AudioInputError` (answer 400) or
:class:`AudioTooLargeError` (answer 413).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import av
import numpy as np

from config.settings import SessionSettings
from streaming.audio_in.exceptions import AudioInputError, AudioTooLargeError
from streaming.audio_in.resample import resample_mono
from streaming.audio_rates import OUT_RATE

logger = logging.getLogger(__name__)

#: Content types of audio files, and the FFmpeg demuxer each one is opened with.
CONTAINER_FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "audio/wav": "wav",
        "audio/x-wav": "wav",
        "audio/wave": "wav",
        "audio/vnd.wave": "wav",
        "audio/mpeg": "mp3",
        "audio/mp3": "mp3",
        "audio/ogg": "ogg",
        "audio/opus": "ogg",
        "application/ogg": "ogg",
        "audio/flac": "flac",
        "audio/x-flac": "flac",
        "audio/webm": "matroska",
        "audio/mp4": "mov",
        "audio/m4a": "mov",
        "audio/x-m4a": "mov",
        "audio/aac": "aac",
    }
)
#: Content types of raw PCM bodies.
RAW_PCM_TYPES: tuple[str, ...] = ("audio/l16", "audio/pcm", "application/octet-stream")
#: Every content type :func:`decode_pushed_audio` accepts, as error messages list them.
SUPPORTED_TYPES: tuple[str, ...] = (
    *CONTAINER_FORMATS,
    "audio/L16",
    "audio/pcm",
    "application/octet-stream",
)

_RAW_FORMATS: Mapping[str, str] = MappingProxyType({"s16le": "<i2", "f32le": "<f4"})
_MIN_RATE, _MAX_RATE = 1_000, 384_000
_MAX_CHANNELS = 32
# The seconds limit when settings give only a byte limit: far more than an app pushes
# at once, and a cap on what a small compressed body may expand to.
DEFAULT_MAX_SECONDS = 600.0


@dataclass(frozen=True)
class AudioLimits:
    """How much audio one push may carry: body bytes and decoded seconds.

    The seconds limit matters for compressed bodies: a small FLAC of silence can
    expand to hours of samples.
    """

    max_bytes: int
    max_seconds: float = DEFAULT_MAX_SECONDS

    @classmethod
    def from_settings(
        cls, settings: SessionSettings, *, max_seconds: float = DEFAULT_MAX_SECONDS
    ) -> AudioLimits:
        """Limits from ``session.max_audio_push_bytes`` and ``max_seconds``."""
        return cls(max_bytes=settings.max_audio_push_bytes, max_seconds=max_seconds)

    def check_bytes(self, n_bytes: int) -> None:
        """Raise :class:`AudioTooLargeError` when a body of ``n_bytes`` is over the limit.

        Call it with the Content-Length before reading a request body.
        """
        if n_bytes > self.max_bytes:
            raise AudioTooLargeError(
                f"the audio body is {n_bytes} bytes; at most {self.max_bytes} bytes may be "
                "pushed at once (session.max_audio_push_bytes): send it in smaller pieces"
            )

    def check_seconds(self, seconds: float) -> None:
        """Raise :class:`AudioTooLargeError` when ``seconds`` of audio is over the limit."""
        if seconds > self.max_seconds:
            raise AudioTooLargeError(
                f"the audio is longer than {self.max_seconds:g} s, the most one push may "
                f"carry ({seconds:.1f} s decoded so far): send it in smaller pieces"
            )


def parse_content_type(header: str) -> tuple[str, dict[str, str]]:
    """Split ``"audio/L16; rate=16000"`` into ``("audio/l16", {"rate": "16000"})``.

    The media type and parameter names are lower-cased; quotes around values are removed.
    """
    media, *rest = header.split(";")
    params: dict[str, str] = {}
    for part in rest:
        name, sep, value = part.partition("=")
        if sep:
            params[name.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), params


def sniff_audio_type(body: bytes) -> str | None:
    """The content type of an audio file recognised by its first bytes, or None.

    For bodies that arrive without a usable content type (a TTS server answering
    ``application/octet-stream``); only WAV, Ogg, FLAC and MP3 are recognised.
    """
    if body[:4] == b"RIFF" and body[8:12] == b"WAVE":
        return "audio/wav"
    if body[:4] == b"OggS":
        return "audio/ogg"
    if body[:4] == b"fLaC":
        return "audio/flac"
    if body[:3] == b"ID3" or (len(body) > 1 and body[0] == 0xFF and body[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    return None


def decode_pushed_audio(
    body: bytes,
    content_type: str,
    params: Mapping[str, str],
    *,
    limits: AudioLimits | None = None,
) -> np.ndarray:
    """Decode a pushed body to float32 mono samples at 48 kHz (``OUT_RATE``) in [-1, 1].

    ``content_type`` is the whole Content-Type header (its parameters are read);
    ``params`` are the request's query parameters. Raw PCM reads ``rate``,
    ``channels`` and ``format`` from the content type's parameters first, then from
    ``params``. ``audio/L16`` needs ``rate``, its ``channels`` defaults to 1 (RFC 2586);
    ``application/octet-stream`` and ``audio/pcm`` need all three.

    Raises :class:`AudioTooLargeError` over ``limits`` and :class:`AudioInputError` for
    anything else that cannot be decoded, with a message saying what to change.
    """
    if limits is not None:
        limits.check_bytes(len(body))
    if not body:
        raise AudioInputError("the audio body is empty: send the audio in the request body")
    media, type_params = parse_content_type(content_type)
    if media in CONTAINER_FORMATS:
        pcm = decode_container(body, media, limits=limits)
    elif media in RAW_PCM_TYPES:
        pcm = _decode_raw(body, media, {**params, **type_params}, limits)
    else:
        raise AudioInputError(
            f"unsupported audio content type {media or '(none)'!r}; "
            f"send one of: {', '.join(SUPPORTED_TYPES)}"
        )
    logger.debug("decoded %d bytes of %s: %.2f s", len(body), media, len(pcm) / OUT_RATE)
    return pcm


def decode_container(body: bytes, media: str, *, limits: AudioLimits | None = None) -> np.ndarray:
    """Decode an audio file of type ``media`` (a key of :data:`CONTAINER_FORMATS`).

    It is opened with that type's FFmpeg demuxer; any rate and channel count; the first
    audio stream is used. Returns float32 mono at 48 kHz. Raises :class:`AudioInputError` or
    :class:`AudioTooLargeError`.
    """
    demuxer = CONTAINER_FORMATS.get(media)
    if demuxer is None:
        raise AudioInputError(
            f"{media!r} is not an audio file type; use one of: {', '.join(CONTAINER_FORMATS)}"
        )
    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(
            io.BytesIO(body), mode="r", format=demuxer, metadata_errors="replace"
        ) as container:
            if not container.streams.audio:
                raise AudioInputError(f"the {media} body holds no audio stream")
            stream = container.streams.audio[0]
            # One resampler only, so its pass-through case (input already 48 kHz mono
            # flt hands back the input frame, altered) harms nothing: each frame is
            # copied out before the next one is decoded.
            resampler = av.AudioResampler(format="flt", layout="mono", rate=OUT_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1).copy())
                    total += out.samples
                if limits is not None:
                    # Checked while decoding: a few KiB can expand to hours of samples.
                    limits.check_seconds(total / OUT_RATE)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1).copy())
    except av.error.FFmpegError as exc:
        raise AudioInputError(
            f"cannot decode the body as {media} ({exc.strerror}); check that the "
            "Content-Type matches the audio format sent"
        ) from exc
    pcm = _finish(chunks)
    if limits is not None:
        limits.check_seconds(len(pcm) / OUT_RATE)
    return pcm


def _decode_raw(
    body: bytes, media: str, params: Mapping[str, str], limits: AudioLimits | None
) -> np.ndarray:
    if media == "audio/l16":
        dtype, sample_format = ">i2", "s16be"
        channels = _int_param(params, "channels", media, 1, _MAX_CHANNELS, default=1)
    else:
        sample_format = _required(params, "format", media).lower()
        if sample_format not in _RAW_FORMATS:
            raise AudioInputError(
                f"format={sample_format!r} is not supported for {media}; "
                f"use one of: {', '.join(_RAW_FORMATS)}"
            )
        dtype = _RAW_FORMATS[sample_format]
        channels = _int_param(params, "channels", media, 1, _MAX_CHANNELS)
    rate = _int_param(params, "rate", media, _MIN_RATE, _MAX_RATE)
    frame_bytes = np.dtype(dtype).itemsize * channels
    if len(body) % frame_bytes:
        raise AudioInputError(
            f"{sample_format} audio with {channels} channel(s) needs a multiple of "
            f"{frame_bytes} bytes; the body has {len(body)} (a truncated upload, or the "
            "wrong format or channels parameter)"
        )
    n_frames = len(body) // frame_bytes
    if limits is not None:
        limits.check_seconds(n_frames / rate)
    samples = np.frombuffer(body, dtype=dtype).reshape(n_frames, channels)
    if dtype == "<f4":
        mono = np.nan_to_num(samples.mean(axis=1, dtype=np.float32), posinf=1.0, neginf=-1.0)
    else:
        mono = samples.mean(axis=1, dtype=np.float32) / np.float32(32768.0)
    return _finish([resample_mono(np.clip(mono, -1.0, 1.0), rate, OUT_RATE)])


def _required(params: Mapping[str, str], name: str, media: str) -> str:
    value = params.get(name)
    if value is None or not value.strip():
        raise AudioInputError(
            f"raw PCM ({media}) needs the {name!r} parameter, e.g. "
            "?format=s16le&rate=16000&channels=1 (or audio/L16;rate=16000;channels=1)"
        )
    return value.strip()


def _int_param(
    params: Mapping[str, str],
    name: str,
    media: str,
    low: int,
    high: int,
    *,
    default: int | None = None,
) -> int:
    if default is not None and name not in params:
        return default
    text = _required(params, name, media)
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise AudioInputError(
            f"{name}={text!r} is not valid: use a whole number from {low} to {high}"
        )
    return value


def _finish(chunks: list[np.ndarray]) -> np.ndarray:
    pcm = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else None
    if pcm is None or len(pcm) == 0:
        raise AudioInputError(
            "the body holds no audio samples: send at least one sample, in the format "
            "its Content-Type names"
        )
    # Resampling filters ring a little past full scale; the pipeline expects [-1, 1].
    return np.clip(pcm, -1.0, 1.0)
