"""H.264 encoding of the outgoing avatar video, tuned for real time.

aiortc encodes H.264 with libx264 at its own fixed settings (no preset, so x264's
"medium"; 1 Mbit/s clamped to 0.5–3 Mbit/s; a 1/30 s time base). That costs ≈14 ms per
720p frame on a 2-core CPU (``docs/architecture.md`` §6), too much with many sessions
per machine. This module keeps aiortc's H.264 packetizer, ``target_bitrate`` and REMB handling by
subclassing its ``H264Encoder``, opens the codec with our options instead, picks NVENC
when a GPU can run it, and hands the encoder to one sender at a time (no global patching
of aiortc).

Per session, with aiortc 1.16, the order matters::

    factory = EncoderFactory(settings.video)        # once per server: probes NVENC once
    sender = pc.addTrack(video_track)
    transceiver = next(t for t in pc.getTransceivers() if t.sender is sender)
    prefer_h264(transceiver)                        # BEFORE setRemoteDescription
    await pc.setRemoteDescription(offer)
    await pc.setLocalDescription(await pc.createAnswer())
    codec = negotiated_codec(transceiver)
    if codec is not None:
        install_encoder(sender, factory.create(width, height, fps), codec)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import av
import numpy as np
from aiortc import RTCRtpCodecParameters, RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import is_rtx
from aiortc.codecs.h264 import H264Encoder
from av.video.codeccontext import VideoCodecContext
from av.video.frame import PictureType

from config.settings import VideoSettings
from streaming.webrtc.compat import install_sender_encoder, negotiated_codecs

logger = logging.getLogger(__name__)

#: The two encoders lipstream can drive; both produce Annex B H.264.
CodecName = Literal["libx264", "h264_nvenc"]

#: Bitrate at 25 fps by frame area: (largest area in pixels, bits per second). Larger
#: frames scale the last entry by their area.
BITRATE_BY_AREA: tuple[tuple[int, int], ...] = (
    (854 * 480, 1_200_000),
    (1280 * 720, 2_500_000),
    (1920 * 1080, 4_500_000),
)
_BITRATE_REFERENCE_FPS = 25

#: H.264 Annex A, table A-1: (level, max frame size in macroblocks, max macroblocks per
#: second, max bitrate in kbit/s for Baseline). The smallest level that fits is used, so
#: 1280×720 at up to 30 fps stays at 3.1, the level every browser's offer names.
H264_LEVELS: tuple[tuple[str, int, int, int], ...] = (
    ("3.1", 3_600, 108_000, 14_000),
    ("3.2", 5_120, 216_000, 20_000),
    ("4.0", 8_192, 245_760, 20_000),
    ("4.1", 8_192, 245_760, 50_000),
    ("4.2", 8_704, 522_240, 50_000),
    ("5.1", 36_864, 983_040, 240_000),
    ("5.2", 36_864, 2_073_600, 240_000),
)

# libx264 preset name -> NVENC preset (p1 fastest .. p7 best), so one setting means
# "how much effort" on both encoders.
_NVENC_PRESETS: dict[str, str] = {
    "ultrafast": "p1",
    "superfast": "p1",
    "veryfast": "p2",
    "faster": "p3",
    "fast": "p3",
    "medium": "p4",
    "slow": "p5",
    "slower": "p6",
    "veryslow": "p7",
}

# How far REMB may move the bitrate from the configured one. Below 0.25× the picture
# falls apart. The configured bitrate is the ceiling: above it we would spend CPU and
# bandwidth the session was not sized for (a receiver's REMB climbed to 1.4× within
# 10 s of a call on loopback).
REMB_MIN_FACTOR = 0.25
REMB_MAX_FACTOR = 1.0

# The RTP clock: frames keep their pts exactly. A 1/fps time base (aiortc uses 1/30)
# makes PyAV round every pts, which jitters x264's rate control for 25 fps input.
_TIME_BASE = Fraction(1, 90_000)
_PROBE_SIZE = (256, 144)


def default_bitrate(width: int, height: int, fps: float) -> int:
    """Bits per second for a frame size when ``video.bitrate_kbps`` is not set.

    1.2 Mbit/s up to 854×480, 2.5 up to 1280×720, 4.5 up to 1920×1080 (larger frames
    scale by area), all at 25 fps and scaled linearly by ``fps / 25``.
    """
    area = width * height
    largest_area, largest_rate = BITRATE_BY_AREA[-1]
    base = next(
        (rate for limit, rate in BITRATE_BY_AREA if area <= limit),
        largest_rate * area / largest_area,
    )
    return round(base * fps / _BITRATE_REFERENCE_FPS)


def h264_level(width: int, height: int, fps: float, max_bitrate: int) -> str:
    """The smallest H.264 level (``"3.1"``, ``"4.0"`` ...) that fits the frame size, the
    macroblock rate and ``max_bitrate`` (bits/s); the largest level if none does."""
    frame_mbs = math.ceil(width / 16) * math.ceil(height / 16)
    for level, max_fs, max_mbps, max_kbps in H264_LEVELS:
        if frame_mbs <= max_fs and frame_mbs * fps <= max_mbps and max_bitrate <= max_kbps * 1000:
            return level
    return H264_LEVELS[-1][0]


@dataclass(frozen=True)
class EncoderConfig:
    """Everything one H.264 encoder is opened with.

    ``preset`` is the libx264 preset name as configured; NVENC maps it to p1..p7.
    ``bitrate`` is in bits per second; ``gop`` is the keyframe interval in frames.
    """

    codec_name: CodecName
    width: int
    height: int
    fps: int
    preset: str
    bitrate: int
    gop: int
    level: str
    profile: str = "baseline"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
            raise ValueError(
                f"frame size {self.width}x{self.height} must be positive and even (yuv420p)"
            )
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {self.fps}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = the encoder decides), got {self.threads}")
        if self.bitrate <= 0 or self.gop < 1:
            raise ValueError(f"bitrate ({self.bitrate}) and gop ({self.gop}) must be positive")
        if self.preset not in _NVENC_PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; use one of {list(_NVENC_PRESETS)}")

    @classmethod
    def from_settings(
        cls,
        settings: VideoSettings,
        width: int,
        height: int,
        fps: int = 25,
        *,
        codec_name: CodecName = "libx264",
    ) -> EncoderConfig:
        """Build the config for one stream from the ``video`` settings section."""
        if settings.bitrate_kbps is not None:
            bitrate = settings.bitrate_kbps * 1000
        else:
            bitrate = default_bitrate(width, height, fps)
        return cls(
            codec_name=codec_name,
            width=width,
            height=height,
            fps=fps,
            preset=settings.preset,
            bitrate=bitrate,
            gop=max(1, round(settings.keyframe_interval_s * fps)),
            level=h264_level(width, height, fps, round(bitrate * REMB_MAX_FACTOR)),
            threads=settings.encoder_threads,
        )

    @property
    def min_bitrate(self) -> int:
        """The lowest bitrate REMB may ask for (0.25× the configured one)."""
        return round(self.bitrate * REMB_MIN_FACTOR)

    @property
    def max_bitrate(self) -> int:
        """The highest bitrate REMB may ask for (the configured one)."""
        return round(self.bitrate * REMB_MAX_FACTOR)

    def resized(self, width: int, height: int) -> EncoderConfig:
        """The same config for another frame size (level recomputed, bitrate kept)."""
        level = h264_level(width, height, self.fps, self.max_bitrate)
        return replace(self, width=width, height=height, level=level)

    def codec_options(self, bitrate: int | None = None) -> dict[str, str]:
        """FFmpeg options for ``codec_name`` at ``bitrate`` (default: the configured one).

        Both encoders: constrained baseline (what every browser decodes), no B-frames,
        no lookahead, a keyframe every ``gop`` frames, and forced keyframes as IDR so a
        PLI really gives the receiver a fresh start.
        """
        rate = self.bitrate if bitrate is None else bitrate
        common = {
            "profile": self.profile,
            "level": self.level,
            "g": str(self.gop),
            "bf": "0",
            "forced-idr": "1",
            # A one-second VBV buffer caps bursts (aiortc has no pacer: every packet of
            # a frame leaves at once) without starving keyframes.
            "bufsize": str(rate),
        }
        if self.codec_name == "h264_nvenc":
            return common | {
                "preset": _NVENC_PRESETS[self.preset],
                "tune": "ull",
                "zerolatency": "1",
                "delay": "0",
                "rc": "cbr",
            }
        options = common | {
            "preset": self.preset,
            "tune": "zerolatency",
            "maxrate": str(rate),
            # One thread per stream by default: a server runs many streams at once, so
            # streams are the parallelism; x264's own default (1.5 threads per core,
            # sliced with zerolatency) would start dozens of threads per call.
            "threads": str(self.threads),
        }
        if self.preset == "ultrafast":
            # x264's ultrafast also turns the deblocking filter off, which shows as
            # blocks when REMB lowers the bitrate; keeping it costs little (720p at
            # 625 kbit/s: Y-PSNR 50.6 -> 51.0 dB, encode time within this VM's noise).
            options["x264-params"] = "deblock=0,0"
        return options


def open_codec(config: EncoderConfig, bitrate: int | None = None) -> VideoCodecContext:
    """Create and open an encoder context for ``config`` (raises ``av.FFmpegError``)."""
    rate = config.bitrate if bitrate is None else bitrate
    codec = av.CodecContext.create(config.codec_name, "w")
    codec.width = config.width
    codec.height = config.height
    codec.pix_fmt = "yuv420p"
    codec.framerate = Fraction(config.fps)
    codec.time_base = _TIME_BASE
    codec.bit_rate = rate
    codec.options = config.codec_options(rate)
    # Open now rather than on the first encode so a failure can be handled where the
    # codec is chosen (NVENC -> libx264), not in the middle of aiortc's send loop.
    codec.open()
    return codec


class LipstreamH264Encoder(H264Encoder):
    """aiortc's H.264 encoder opened with an :class:`EncoderConfig`.

    aiortc's packetizer, ``encode()`` and REMB handling are inherited. REMB moves
    ``target_bitrate`` within [0.25×, 1×] of the configured bitrate, and the open codec
    follows it in place (FFmpeg reconfigures x264's rate control, and NVENC's where the
    GPU supports dynamic bitrate): unlike aiortc, which re-creates the codec on a 10%
    move, no IDR burst and no new encoder threads. A new frame size re-opens the codec.
    A forced keyframe (PLI) is an IDR. If NVENC cannot be opened for this stream (e.g. the GPU's
    session limit), the stream falls back to libx264 with a warning.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self._config = config
        self._target = config.bitrate

    @property
    def config(self) -> EncoderConfig:
        """The config in use (after any size change or NVENC fallback)."""
        return self._config

    @property
    def target_bitrate(self) -> int:
        """Target bitrate in bits per second, as REMB last asked, clamped."""
        return self._target

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._target = max(self._config.min_bitrate, min(int(bitrate), self._config.max_bitrate))

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        # A generator like aiortc's: H264Encoder.encode() reads frame.pts before this
        # runs, so PyAV rebasing the frame's pts cannot change the RTP timestamp.
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        codec = self.codec
        if codec is not None and (frame.width, frame.height) != (codec.width, codec.height):
            self.buffer_data = b""
            self.buffer_pts = None
            codec = self.codec = None
        if codec is not None and codec.bit_rate != self._target:
            codec.bit_rate = self._target  # read by the encoder on its next frame
        # With forced-idr=1 an I picture request becomes an IDR; NONE lets the encoder
        # decide (a frame object reused by the track may carry an old type).
        frame.pict_type = PictureType.I if force_keyframe else PictureType.NONE
        if codec is None:
            codec = self.codec = self._open(frame.width, frame.height)
        data = b"".join(bytes(packet) for packet in codec.encode(frame))
        if data:
            yield from self._split_bitstream(data)

    def _open(self, width: int, height: int) -> VideoCodecContext:
        if (width, height) != (self._config.width, self._config.height):
            logger.warning(
                "video frames are %dx%d, the encoder was configured for %dx%d; re-opening",
                width,
                height,
                self._config.width,
                self._config.height,
            )
            self._config = self._config.resized(width, height)
        try:
            return open_codec(self._config, self._target)
        except (av.FFmpegError, ValueError) as exc:
            if self._config.codec_name != "h264_nvenc":
                raise
            logger.warning("h264_nvenc failed to open for this stream (%s); using libx264", exc)
            self._config = replace(self._config, codec_name="libx264")
            return open_codec(self._config, self._target)


def probe_nvenc(settings: VideoSettings) -> str | None:
    """Open h264_nvenc with our options and encode one 256×144 frame.

    Returns why it failed (for logs and health pages), or None when NVENC works here.
    """
    width, height = _PROBE_SIZE
    config = EncoderConfig.from_settings(settings, width, height, codec_name="h264_nvenc")
    try:
        codec = open_codec(config)
        frame = av.VideoFrame.from_ndarray(
            np.zeros((height * 3 // 2, width), dtype=np.uint8), format="yuv420p"
        )
        frame.pts = 0
        frame.time_base = _TIME_BASE
        codec.encode(frame)
        codec.encode(None)
    except (av.FFmpegError, ValueError) as exc:  # ValueError: a build without NVENC
        return f"{type(exc).__name__}: {exc}"
    return None


def pick_encoder(settings: VideoSettings) -> CodecName:
    """Choose the encoder for ``settings.encoder``, opening NVENC once to find out.

    ``"auto"`` uses h264_nvenc when it opens and encodes a test frame, else libx264. An
    explicit ``"h264_nvenc"`` that cannot open also falls back to libx264, with a
    warning: the server must still stream.
    """
    if settings.encoder == "libx264":
        return "libx264"
    error = probe_nvenc(settings)
    if error is None:
        logger.info("video encoder: h264_nvenc")
        return "h264_nvenc"
    if settings.encoder == "h264_nvenc":
        logger.warning(
            "video.encoder is h264_nvenc but it cannot be used here (%s); falling back to libx264",
            error,
        )
    else:
        logger.info("video encoder: libx264 (h264_nvenc unavailable: %s)", error)
    return "libx264"


class EncoderFactory:
    """Makes per-stream encoders; build one per server (it probes NVENC once)."""

    def __init__(self, settings: VideoSettings) -> None:
        self._settings = settings
        self._codec_name = pick_encoder(settings)

    @property
    def codec_name(self) -> CodecName:
        """The encoder chosen at construction: ``"libx264"`` or ``"h264_nvenc"``."""
        return self._codec_name

    def config(self, width: int, height: int, fps: int = 25) -> EncoderConfig:
        """The config :meth:`create` would use for this stream."""
        return EncoderConfig.from_settings(
            self._settings, width, height, fps, codec_name=self._codec_name
        )

    def create(self, width: int, height: int, fps: int = 25) -> LipstreamH264Encoder:
        """A new encoder for one stream of ``width``×``height`` frames at ``fps``."""
        return LipstreamH264Encoder(self.config(width, height, fps))


def prefer_h264(transceiver: RTCRtpTransceiver) -> bool:
    """Restrict ``transceiver`` to H.264 (and its RTX); False if aiortc offers no H.264.

    Call it BEFORE ``setRemoteDescription``: aiortc applies codec preferences while it
    negotiates the remote offer, so a later call changes nothing for that negotiation.
    A remote peer without H.264 then fails negotiation instead of silently getting VP8.
    """
    capabilities = RTCRtpSender.getCapabilities("video").codecs
    h264 = [c for c in capabilities if c.mimeType.lower() == "video/h264"]
    if not h264:
        return False
    transceiver.setCodecPreferences(h264 + [c for c in capabilities if is_rtx(c)])
    return True


def negotiated_codec(transceiver: RTCRtpTransceiver) -> RTCRtpCodecParameters | None:
    """The codec ``transceiver``'s sender will send with, once negotiated, else None.

    aiortc sends with the first entry of the negotiated list.
    """
    codecs = negotiated_codecs(transceiver)
    return codecs[0] if codecs else None


def install_encoder(
    sender: RTCRtpSender, encoder: H264Encoder, codec: RTCRtpCodecParameters
) -> bool:
    """Make ``sender`` encode with ``encoder`` instead of aiortc's default encoder.

    Only when ``codec`` (see :func:`negotiated_codec`) is H.264; otherwise (e.g. VP8)
    the sender is left alone and False is returned. Call it before media flows (after
    ``setLocalDescription`` is fine): aiortc creates its own encoder on the first frame
    only if none is set. Raises ``RuntimeError`` if this aiortc version no longer keeps
    the encoder where we set it.
    """
    if codec.mimeType.lower() != "video/h264":
        logger.info("sender negotiated %s, not H.264; keeping aiortc's encoder", codec.mimeType)
        return False
    if sender.kind != "video":
        raise ValueError(f"an H.264 encoder needs a video sender, not {sender.kind!r}")
    install_sender_encoder(sender, encoder)
    return True
