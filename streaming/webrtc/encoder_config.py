"""What one H.264 encoder is opened with: bitrate, level, preset and FFmpeg options.

:class:`EncoderConfig` turns the ``video`` settings and a stream's frame size and fps
into the options of libx264 or NVENC (``docs/design/webrtc.md`` §6): constrained
baseline, no B-frames, no lookahead, a keyframe interval, a VBV buffer of
:data:`VBV_S` at the rate the codec is opened with (so no frame, an IDR included, holds
more than the link drains in a few frame times: §19), the preset (mapped to NVENC's
p1..p7), and a bitrate by frame area, the most the call's bandwidth estimate may give
it. :meth:`EncoderConfig.at_step` is the same stream at a step of the call's quality
ladder (a smaller frame, a lower frame rate). :func:`open_codec` opens a codec context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import av
from av.video.codeccontext import VideoCodecContext

from config.settings import VideoSettings

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

#: The VBV buffer in seconds at the rate the codec is opened for: the largest frame (an
#: IDR) is at most this much of the link's time at that rate. A caller's jitter buffer
#: is sized by its largest frames against the link (Chromium's estimator keeps the
#: largest frame for minutes), so on a 300 kbit/s link a 0.3 s buffer held its video
#: 250 ms back; 0.15 s keeps a 720p IDR of the demo avatar at 18 KB at 1.3 Mbit/s and
#: 6.4 KB at 450 kbit/s, for 7-16 % less than the target on average
#: (docs/performance/networks.md).
VBV_S = 0.15
#: The least bitrate a stream is given, whatever the estimate (bits per second).
MIN_BITRATE = 30_000

# The RTP clock: frames keep their pts exactly. A 1/fps time base (aiortc uses 1/30)
# makes PyAV round every pts, which jitters x264's rate control for 25 fps input.
TIME_BASE = Fraction(1, 90_000)


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
    #: libx264 only: constant quality (CRF) capped at the bitrate, instead of the bitrate
    #: itself (the shared idle loops, ``docs/design/idle-loops.md`` §16); None = the bitrate.
    crf: float | None = None
    #: The VBV buffer, in seconds at the rate the codec is opened with.
    vbv_s: float = VBV_S

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
            level=h264_level(width, height, fps, bitrate),
            threads=settings.encoder_threads,
            vbv_s=settings.vbv_s,
        )

    @property
    def min_bitrate(self) -> int:
        """The lowest bitrate the stream is given (:data:`MIN_BITRATE`)."""
        return min(MIN_BITRATE, self.bitrate)

    @property
    def max_bitrate(self) -> int:
        """The highest bitrate the stream is given (the configured one)."""
        return self.bitrate

    def resized(self, width: int, height: int) -> EncoderConfig:
        """The same config for another frame size (level recomputed, bitrate kept)."""
        level = h264_level(width, height, self.fps, self.bitrate)
        return replace(self, width=width, height=height, level=level)

    def at_step(self, scale: float, fps: int) -> EncoderConfig:
        """This stream at a step of the quality ladder: the frame scaled by ``scale``
        (even sides), ``fps`` frames a second, the bitrate scaled by the pixel rate and
        the keyframe interval kept in seconds (``docs/design/link.md`` §19)."""
        width = max(2, 2 * round(self.width * scale / 2))
        height = max(2, 2 * round(self.height * scale / 2))
        if (width, height, fps) == (self.width, self.height, self.fps):
            return self
        pixels = width * height * fps / (self.width * self.height * self.fps)
        bitrate = max(MIN_BITRATE, round(self.bitrate * pixels))
        return replace(
            self,
            width=width,
            height=height,
            fps=fps,
            bitrate=bitrate,
            gop=max(1, round(self.gop * fps / self.fps)),
            level=h264_level(width, height, fps, bitrate),
        )

    def codec_options(
        self, bitrate: int | None = None, *, vbv_bitrate: int | None = None
    ) -> dict[str, str]:
        """FFmpeg options for ``codec_name`` at ``bitrate`` (default: the configured one;
        the maximum rate too), the VBV buffer :attr:`vbv_s` at ``vbv_bitrate`` (default:
        ``bitrate``).

        Both encoders: constrained baseline (what every browser decodes), no B-frames,
        no lookahead, a keyframe every ``gop`` frames, and forced keyframes as IDR so a
        PLI really gives the receiver a fresh start.
        """
        rate = self.bitrate if bitrate is None else bitrate
        vbv_rate = rate if vbv_bitrate is None else vbv_bitrate
        common = {
            "profile": self.profile,
            "level": self.level,
            "g": str(self.gop),
            "bf": "0",
            "forced-idr": "1",
            # A short VBV buffer caps the largest frame (an IDR) at what the link drains
            # in a few frame times (VBV_S); the codec is re-opened at an IDR when the
            # rate moves far from the one it was opened with (video_encoder.py).
            "bufsize": str(round(vbv_rate * self.vbv_s)),
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
        if self.crf is not None:
            options["crf"] = str(self.crf)
        if self.preset == "ultrafast":
            # x264's ultrafast also turns the deblocking filter off, which shows as
            # blocks when REMB lowers the bitrate; keeping it costs little (720p at
            # 625 kbit/s: Y-PSNR 50.6 -> 51.0 dB, encode time within this VM's noise).
            options["x264-params"] = "deblock=0,0"
        return options


def open_codec(
    config: EncoderConfig, bitrate: int | None = None, *, vbv_bitrate: int | None = None
) -> VideoCodecContext:
    """Create and open an encoder context for ``config`` at ``bitrate`` (its maximum
    rate too), its VBV buffer sized for ``vbv_bitrate`` (raises ``av.FFmpegError``)."""
    rate = config.bitrate if bitrate is None else bitrate
    codec = av.CodecContext.create(config.codec_name, "w")
    codec.width = config.width
    codec.height = config.height
    codec.pix_fmt = "yuv420p"
    codec.framerate = Fraction(config.fps)
    codec.time_base = TIME_BASE
    codec.bit_rate = rate
    codec.options = config.codec_options(rate, vbv_bitrate=vbv_bitrate)
    # Open now rather than on the first encode so a failure can be handled where the
    # codec is chosen (NVENC -> libx264), not in the middle of aiortc's send loop.
    codec.open()
    return codec
