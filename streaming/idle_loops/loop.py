"""One avatar's idle loop, H.264-encoded once into RTP payloads every call can send.

A silent call shows the frames of its idle clip bounced, ``start + bounce_index(p, length)``
at bounce position ``p`` (:mod:`compositor.clips`; without clips the clip is every frame
and ``p`` is the call's frame ``n``): the same pictures, in the same order, for every
caller of the avatar playing that clip. :func:`encode_loop` encodes them once per clip
(:attr:`LoopKey.clip_start`, :attr:`LoopKey.clip_stop`), for a loop of :func:`loop_length`
positions (bounce position ``p`` is loop position ``p % length``), with an IDR every
``keyframe_every`` positions and at position 0, so a call may join at any of those
keyframes and the loop's wrap never references a picture from its other end
(``docs/design/idle-loops.md`` §16). The payloads come from the same packetiser a call's own
encoder uses, so a call only stamps its RTP headers on them.

The loop is encoded with the call's live :class:`~streaming.webrtc.encoder_config.EncoderConfig`
except for its preset and bitrate: same codec, size, profile, level and keyframe
interval, so the SPS and PPS a decoder gets at a shared IDR are the live stream's, byte
for byte (:func:`parameter_sets` checks it; a preset that changes them, e.g. one with
more reference frames, is replaced by the live one).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import av
import numpy as np

from compositor.clips import Clip, bounce_index
from compositor.yuv import resize_i420
from streaming.webrtc.encoder_config import TIME_BASE, EncoderConfig, open_codec
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)

_VIDEO_CLOCK = 90_000

# H.264 NAL unit types (ITU-T H.264 table 7-1) and RTP payload types (RFC 6184).
_NAL_IDR = 5
_NAL_SPS = 7
_NAL_PPS = 8
_STAP_A = 24
_FU_A = 28


def bounce_period(frame_count: int) -> int:
    """Frames before the bounce loop of ``frame_count`` avatar frames repeats."""
    return 1 if frame_count <= 1 else 2 * (frame_count - 1)


def loop_length(frame_count: int, keyframe_every: int) -> int:
    """Positions of the encoded loop: the bounce period, repeated until it holds at least
    one keyframe interval (a short avatar, a still image, would otherwise be all IDRs)."""
    period = bounce_period(frame_count)
    return period * max(1, math.ceil(keyframe_every / period))


@dataclass(frozen=True)
class LoopKey:
    """What makes two calls' idle loops the same stream: the avatar's frames (``source``
    changes when they do), the clip (frames ``[clip_start, clip_stop)``; ``clip_stop``
    None is every frame, and is stored as ``frame_count``), the live encoder's config, the
    rung's bitrate, the keyframe interval and the preset."""

    avatar_id: str
    source: str
    config: EncoderConfig
    bitrate: int
    keyframe_every: int
    preset: str
    frame_count: int
    constant_quality: bool = False
    clip_start: int = 0
    clip_stop: int | None = None

    def __post_init__(self) -> None:
        stop = self.frame_count if self.clip_stop is None else self.clip_stop
        if not 0 <= self.clip_start < stop <= self.frame_count:
            raise ValueError(
                f"idle loop clip [{self.clip_start}, {stop}) is not inside the avatar's "
                f"{self.frame_count} frames"
            )
        object.__setattr__(self, "clip_stop", stop)  # one key per clip, however it was named

    @property
    def clip_length(self) -> int:
        """Frames of the clip the loop bounces over."""
        return (self.frame_count if self.clip_stop is None else self.clip_stop) - self.clip_start

    @property
    def length(self) -> int:
        return loop_length(self.clip_length, self.keyframe_every)

    def frame(self, position: int) -> int:
        """The avatar frame at loop (bounce) ``position``."""
        return self.clip_start + bounce_index(position, self.clip_length)

    def for_clip(self, clip: Clip) -> LoopKey:
        """The same loop of another clip of the avatar (:class:`compositor.clips.Clip`)."""
        return replace(self, clip_start=clip.start, clip_stop=clip.stop)


@dataclass(frozen=True, eq=False)
class EncodedLoop:
    """The RTP payloads of every loop position and which positions are IDRs."""

    key: LoopKey
    payloads: tuple[tuple[bytes, ...], ...]
    keyframes: frozenset[int]
    preset: str  # the preset it was encoded with (the live one if ``key.preset`` changed the SPS)
    crf: float | None  # its constant quality, None if encoded at the rung's bitrate

    @property
    def length(self) -> int:
        return len(self.payloads)

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes of payload held (what the cache counts)."""
        return sum(len(p) for frame in self.payloads for p in frame)

    @functools.cached_property
    def max_frame_bytes(self) -> int:
        """The largest frame of the loop (one of its IDRs): what a link must drain in a
        few frame times not to hold the caller's jitter buffer back."""
        return max(sum(len(p) for p in frame) for frame in self.payloads)

    @functools.cached_property
    def bitrate_bps(self) -> int:
        """What a call sending the loop sends on average, keyframes included (payload
        bits a second: what a link must carry for it)."""
        return round(8 * self.nbytes * self.key.config.fps / max(1, self.length))

    def is_keyframe(self, position: int) -> bool:
        return position in self.keyframes

    def packet(self, index: int, fps: int, position: int | None = None) -> av.Packet[Any]:
        """Frame ``index`` of a call, from loop position ``position % length`` (default
        ``index``; a call playing clips passes the bounce position its ``ClipPlan`` gives,
        ``loop_position(index)``): an empty packet stamped with the frame's RTP time whose
        ``opaque`` holds the shared payloads (what :meth:`LipstreamH264Encoder.pack` hands
        to aiortc's sender)."""
        packet = av.Packet(b"")
        packet.pts = index * _VIDEO_CLOCK // fps
        packet.time_base = TIME_BASE
        # A list of its own: PyAV keeps ``opaque`` by the object's identity and drops it
        # when any packet holding that object is freed, so two calls (or two rounds of
        # the loop) handed the same tuple would lose each other's payloads.
        at = index if position is None else position
        packet.opaque = list(self.payloads[at % len(self.payloads)])
        return packet


def carries_idr(payloads: Sequence[bytes]) -> bool:
    """Whether the RTP payloads of one frame hold an IDR slice (single NAL, STAP-A or
    FU-A packets, as aiortc's packetiser makes them)."""
    for payload in payloads:
        kind = payload[0] & 0x1F
        if kind == _NAL_IDR or (kind == _FU_A and len(payload) > 1 and payload[1] & 0x1F == 5):
            return True
        if kind == _STAP_A:
            at = 1
            while at + 2 < len(payload):
                size = int.from_bytes(payload[at : at + 2], "big")
                if payload[at + 2] & 0x1F == _NAL_IDR:
                    return True
                at += 2 + size
    return False


def parameter_sets(config: EncoderConfig, bitrate: int) -> bytes:
    """The SPS and PPS ``config`` opens an encoder with (from one black IDR)."""
    codec = open_codec(config, bitrate)
    frame = av.VideoFrame.from_ndarray(
        np.zeros((config.height * 3 // 2, config.width), dtype=np.uint8), format="yuv420p"
    )
    frame.pts = 0
    frame.time_base = TIME_BASE
    data = b"".join(bytes(p) for p in codec.encode(frame))
    data += b"".join(bytes(p) for p in codec.encode(None))
    units = [u.rstrip(b"\x00") for u in data.split(b"\x00\x00\x01")]
    return b"".join(u for u in units if u and u[0] & 0x1F in (_NAL_SPS, _NAL_PPS))


#: x264's constant quality for idle loops (``LoopKey.constant_quality``): the one CRF
#: whose PPS equals a bitrate-controlled stream's (x264 writes ``pic_init_qp`` 26 for
#: both), visually lossless on the demo avatar (Y-PSNR 50-52 dB at 720p).
LOOP_CRF = 26.0
#: The loops' VBV buffer, in seconds at their rung: their IDRs, one every 0.48 s, stay
#: within about four frames' worth of the rung (a 720p IDR of the demo avatar is 27 KB
#: at constant quality, seven times a 1.25 Mbit/s rung's frame; a caller's jitter
#: buffer grows with the largest frame it sees: docs/design/link.md §19).
LOOP_VBV_S = 0.16


def loop_config(key: LoopKey) -> EncoderConfig:
    """The encoder config of ``key``'s loop: the live one at the rung's bitrate with the
    loop's preset (and, libx264, constant quality capped at that bitrate), unless that
    changes the parameter sets; then the live config at the rung's bitrate."""
    plain = replace(key.config, bitrate=key.bitrate, vbv_s=LOOP_VBV_S)
    crf = LOOP_CRF if key.constant_quality and key.config.codec_name == "libx264" else None
    config = replace(plain, preset=key.preset, crf=crf)
    if config == plain:
        return config
    if parameter_sets(config, key.bitrate) == parameter_sets(key.config, key.bitrate):
        return config
    logger.warning(
        "idle loops at preset %s%s give other H.264 parameter sets than the live stream "
        "(a decoder would reconfigure at every switch); encoding them like the live stream",
        key.preset,
        "" if crf is None else f", CRF {crf:g}",
    )
    return plain


def encode_loop(key: LoopKey, frame_at: Callable[[int], np.ndarray]) -> EncodedLoop:
    """Encode ``key``'s loop from the avatar's frames (``frame_at(i)``: avatar frame ``i``
    as a yuv420p array). CPU-heavy: run it on a background thread."""
    config = loop_config(key)
    encoder = LipstreamH264Encoder(config)
    fps = Fraction(config.fps)
    payloads: list[tuple[bytes, ...]] = []
    keyframes: set[int] = set()
    for position in range(key.length):
        image = frame_at(key.frame(position))
        height, width = image.shape[0] * 2 // 3, image.shape[1]
        if (width, height) != (config.width, config.height):  # a smaller ladder step (§19)
            image = resize_i420(image, config.width, config.height)
        frame = av.VideoFrame.from_numpy_buffer(np.ascontiguousarray(image), format="yuv420p")
        frame.pts = int(position * _VIDEO_CLOCK / fps)
        frame.time_base = TIME_BASE
        frame_payloads, _ = encoder.encode(frame, position % key.keyframe_every == 0)
        if not frame_payloads:
            raise RuntimeError(f"the encoder returned nothing for idle loop position {position}")
        if carries_idr(frame_payloads):
            keyframes.add(position)
        payloads.append(tuple(frame_payloads))
    if 0 not in keyframes:
        raise RuntimeError("the idle loop's first frame is not an IDR")
    return EncodedLoop(key, tuple(payloads), frozenset(keyframes), config.preset, config.crf)
