"""H.264 encoding of the outgoing avatar video, tuned for real time.

aiortc encodes H.264 with libx264 at its own fixed settings (no preset, so x264's
"medium"; 1 Mbit/s clamped to 0.5–3 Mbit/s; a 1/30 s time base). That costs ≈14 ms per
720p frame on a 2-core CPU (``docs/design/webrtc.md`` §6), too much with many sessions
per machine. This module keeps aiortc's H.264 packetizer by subclassing its
``H264Encoder``, opens the codec with our options instead
(:mod:`~streaming.webrtc.encoder_config`), lets the call's link steer its bitrate and
picture (``docs/design/link.md`` §19), and picks NVENC when a GPU can run it; a sender
is given it by :mod:`~streaming.webrtc.h264_sender` (no global patching of aiortc).

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
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import av
import numpy as np
from aiortc.codecs.h264 import H264Encoder, H264PayloadDescriptor
from av.video.codeccontext import VideoCodecContext
from av.video.frame import PictureType

from compositor.yuv import resize_i420
from config.settings import VideoSettings
from streaming.webrtc.encoder_config import TIME_BASE, CodecName, EncoderConfig, open_codec

logger = logging.getLogger(__name__)

_PROBE_SIZE = (256, 144)
#: FFmpeg's quality stats give QP × FF_QP2LAMBDA.
_QP2LAMBDA = 118
#: The codec is opened at HEADROOM × the target (its maximum rate) with a VBV buffer for
#: the target, then given the target: x264 follows a bitrate moved in place, down and
#: back up to the rate it was opened at, but not above it, and not at all when it was
#: opened with a maximum rate of its own. So the codec is re-opened (an IDR sized for
#: the new rate) when the target rises above the rate opened at (no sooner than a
#: second after the last IDR), and when it falls under REOPEN_BELOW × the target it was
#: opened for: x264 would otherwise go on at up to twice the new target for a second or
#: two, on a link that just said it cannot carry it (docs/design/link.md §19).
HEADROOM = 2.0
REOPEN_BELOW = 0.7


class LipstreamH264Encoder(H264Encoder):
    """aiortc's H.264 encoder opened with an :class:`EncoderConfig`, steered by the
    call's link (``docs/design/link.md`` §19).

    aiortc's packetizer and ``encode()`` are inherited. The call's link controller sets
    the target bitrate and the quality ladder's step (:meth:`set_link`): small moves of the
    bitrate are followed in place (FFmpeg reconfigures x264's rate control, and NVENC's
    where the GPU supports it), without an IDR; a step's other frame size or rate
    re-opens the codec. Frames come at the avatar's size and are scaled to the step's.
    The VBV buffer and maximum rate are the ones the codec was opened with (FFmpeg
    cannot change them on an open x264, and x264 does not go above them), so when the
    target has moved far from that rate the codec is re-opened: an IDR sized for the new
    rate (:data:`HEADROOM`, :data:`REOPEN_BELOW`). Keyframe requests from the
    caller (PLI/FIR) are answered at most once per ``keyframe_interval_s`` after the last
    IDR sent (the link sets it from the round trip); the call's own reasons for an IDR
    (leaving a shared loop) always are. If
    NVENC cannot be opened for this stream (e.g. the GPU's session limit), the stream
    falls back to libx264 with a warning.
    """

    def __init__(
        self, config: EncoderConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._top = config  # the full picture, at the avatar's size
        self._config = config  # the step frames are encoded at
        self._step = (1.0, config.fps)
        self._target = config.bitrate
        self._opened_at_rate = config.bitrate  # the codec's maximum rate
        self._opened_for = config.bitrate  # the target it was opened for
        self._keyframe_wanted = False
        self._since_idr = 0
        self._clock = clock
        self._last_idr_at = -math.inf
        #: The least time between two IDRs a caller's PLI/FIR may ask for.
        self.keyframe_interval_s = 0.0
        #: Whether the call may settle on a steady idle loop (few keyframes): the link
        #: says yes while transport-cc feedback drives its estimate and the estimate is
        #: at the full rate (``streaming/live/idle_sharing.py``).
        self.steady_idle = False
        #: Whether the link's estimate comes from the peer's feedback (transport-cc,
        #: REMB, a loss window) rather than its start value: a viewer's quality step
        #: follows only a measured estimate (``streaming/broadcast/feed.py``).
        self.estimate_measured = False
        self.keyframe_requests = 0
        self.keyframe_requests_ignored = 0
        #: QP of the live P-frames encoded lately (read and emptied by the link).
        self.qps: deque[float] = deque(maxlen=64)
        self.frames_scaled = 0

    def close(self) -> None:
        """Free the codec now (x264's state: some 12 MiB at 720p), not when Python frees
        this encoder, which for one in a call's reference cycles is its next full
        collection. A frame encoded after this opens a new codec."""
        self.codec = None
        self.buffer_data = b""
        self.buffer_pts = None

    def request_keyframe(self) -> None:
        """The next frame encoded is an IDR (the call's own need: e.g. leaving a shared
        idle loop). Never throttled: the decoder cannot follow without it."""
        self._keyframe_wanted = True

    def peer_requests_keyframe(self) -> None:
        """The caller lost the picture (PLI/FIR): an IDR unless one went out less than
        :attr:`keyframe_interval_s` ago (it is on its way; a burst of requests for one
        loss gets one IDR).

        aiortc passes its own flag only to frames it encodes itself; frames handed to it
        encoded (:meth:`encode_packet`) learn of the request here (see
        :func:`~streaming.webrtc.compat.forward_keyframe_requests`).
        """
        self.keyframe_requests += 1
        if self._clock() - self._last_idr_at < self.keyframe_interval_s:
            self.keyframe_requests_ignored += 1
            return
        self._keyframe_wanted = True

    @property
    def since_idr_s(self) -> float:
        """Seconds since the last IDR went out (this encoder's or a shared loop's)."""
        return self._clock() - self._last_idr_at

    @property
    def keyframe_wanted(self) -> bool:
        """Whether a keyframe request (or a switch back from a shared idle loop) waits."""
        return self._keyframe_wanted

    def take_keyframe_request(self) -> None:
        """A keyframe was sent without this encoder (a shared idle loop's IDR): the
        request is answered."""
        self._keyframe_wanted = False
        self._last_idr_at = self._clock()

    def set_link(self, scale: float, fps: int, bitrate: int) -> None:
        """Encode from the next frame on at the ladder step ``scale`` × the avatar's size,
        ``fps`` frames a second, aiming at ``bitrate`` (clamped to the step's)."""
        self._step = (scale, fps)
        self._config = self._top.at_step(scale, fps)
        self.target_bitrate = bitrate

    @property
    def sends_every_frame(self) -> bool:
        """Whether this step sends every frame of the call (its frame rate is full)."""
        return self._config.fps >= self._top.fps

    def sends(self, index: int) -> bool:
        """Whether frame ``index`` of the call's full-rate stream is sent at this step
        (all of them, unless the step lowered the frame rate)."""
        full, rate = self._top.fps, self._config.fps
        return rate >= full or (index * rate) // full != ((index - 1) * rate) // full

    def encode_packet(self, frame: av.VideoFrame) -> av.Packet[Any]:
        """Encode and packetise ``frame`` off the event loop, for the sender to send as is.

        Returns an empty ``av.Packet`` stamped with the frame's RTP time (1/90000) whose
        ``opaque`` holds the RTP payloads; :meth:`pack` hands them to aiortc's sender, so
        the loop does no H.264 work and no thread hand-off of its own for the frame
        (``docs/design/webrtc.md`` §6). Frames of one stream are encoded one at a time, in
        order (the video track awaits each before asking for the next).
        """
        force, self._keyframe_wanted = self._keyframe_wanted, False
        payloads, timestamp = self.encode(frame, force)
        return payload_packet(payloads, timestamp)

    def pack(self, packet: av.Packet[Any]) -> tuple[list[bytes], int]:
        """RTP payloads and timestamp of ``packet``: as made by :meth:`encode_packet`, or
        aiortc's packetizer for a packet of H.264 bytes."""
        payloads = packet.opaque
        if isinstance(payloads, list):
            assert packet.pts is not None
            return payloads, packet.pts
        return super().pack(packet)

    @property
    def config(self) -> EncoderConfig:
        """The config the next frame is encoded with: the link's step (after any avatar
        size change or NVENC fallback)."""
        return self._config

    @property
    def source_size(self) -> tuple[int, int]:
        """The avatar's frame size, before the ladder's step scales it."""
        return self._top.width, self._top.height

    @property
    def target_bitrate(self) -> int:
        """The bitrate the link asks for, clamped to the step's."""
        return self._target

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._target = max(self._config.min_bitrate, min(int(bitrate), self._config.max_bitrate))

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        # A generator like aiortc's: H264Encoder.encode() reads frame.pts before this
        # runs, so PyAV rebasing the frame's pts cannot change the RTP timestamp.
        if frame.format.name != "yuv420p":
            frame = frame.reformat(format="yuv420p")
        self._follow_source(frame.width, frame.height)
        config = self._config
        if (frame.width, frame.height) != (config.width, config.height):
            frame = self._scaled(frame, config)
        codec = self.codec
        target = self._target
        # An IDR is forced one frame before x264's own interval would make one, so that
        # every IDR passes here and may re-open the codec at the current rate.
        idr = force_keyframe or self._since_idr >= config.gop - 1
        if codec is not None and (
            (codec.width, codec.height) != (config.width, config.height)
            or codec.framerate != config.fps
            or target < REOPEN_BELOW * self._opened_for
            or (target > self._opened_at_rate and (idr or self._since_idr >= config.fps))
        ):
            self.buffer_data = b""
            self.buffer_pts = None
            codec = self.codec = None
        if codec is not None and codec.bit_rate != target:
            codec.bit_rate = target  # read by the encoder on its next frame
        # With forced-idr=1 an I picture request becomes an IDR; NONE lets the encoder
        # decide (a frame object reused by the track may carry an old type).
        frame.pict_type = PictureType.I if idr else PictureType.NONE
        if codec is None:
            codec = self.codec = self._open(config, target)
        data = b""
        for packet in codec.encode(frame):
            data += bytes(packet)
            self._note(packet)
        if data:
            yield from self._split_bitstream(data)

    def _note(self, packet: av.Packet[Any]) -> None:
        if packet.is_keyframe:
            self._since_idr = 0
            self._last_idr_at = self._clock()
            return
        self._since_idr += 1
        if packet.has_sidedata("quality_stats"):
            quality = int.from_bytes(bytes(packet.get_sidedata("quality_stats"))[:4], "little")
            self.qps.append(quality / _QP2LAMBDA)

    def _follow_source(self, width: int, height: int) -> None:
        """Frames of another size than the avatar's: the call switched to an avatar of
        that size (``docs/design/switching.md`` §18); the step applies to it."""
        top = self._top
        if (width, height) in ((top.width, top.height), (self._config.width, self._config.height)):
            return
        logger.info(
            "video frames are %dx%d, the encoder was configured for %dx%d; re-opening",
            width,
            height,
            top.width,
            top.height,
        )
        self._top = top.resized(width, height)
        self._config = self._top.at_step(*self._step)

    def _scaled(self, frame: av.VideoFrame, config: EncoderConfig) -> av.VideoFrame:
        self.frames_scaled += 1
        source = np.asarray(frame.to_ndarray(), dtype=np.uint8)
        image = resize_i420(source, config.width, config.height)
        scaled = av.VideoFrame.from_numpy_buffer(image, format="yuv420p")
        scaled.pts, scaled.time_base = frame.pts, frame.time_base
        return scaled

    def _open(self, config: EncoderConfig, target: int) -> VideoCodecContext:
        """A codec for ``target`` with room to follow it up to :data:`HEADROOM` × in place
        (x264 follows a bitrate moved in place up to the rate it was opened at), its VBV
        buffer sized for ``target``."""
        rate = max(target, min(config.bitrate, round(HEADROOM * target)))
        self._opened_at_rate, self._opened_for = rate, target
        self._since_idr = 0
        try:
            codec = open_codec(config, rate, vbv_bitrate=target)
        except (av.FFmpegError, ValueError) as exc:
            if config.codec_name != "h264_nvenc":
                raise
            logger.warning("h264_nvenc failed to open for this stream (%s); using libx264", exc)
            self._top = replace(self._top, codec_name="libx264")
            self._config = replace(config, codec_name="libx264")
            codec = open_codec(self._config, rate, vbv_bitrate=target)
        codec.bit_rate = target
        return codec


def payload_packet(payloads: list[bytes], timestamp: int) -> av.Packet[Any]:
    """An empty packet stamped with RTP ``timestamp`` whose ``opaque`` holds ``payloads``
    (what :meth:`LipstreamH264Encoder.pack` hands to aiortc's sender; no payloads: the
    sender sends nothing for this slot)."""
    packet = av.Packet(b"")
    packet.pts = timestamp
    packet.time_base = TIME_BASE
    packet.opaque = payloads
    return packet


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
        frame.time_base = TIME_BASE
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


def access_unit(payloads: list[bytes]) -> bytes:
    """The Annex B access unit one frame's H.264 RTP payloads (single NAL units, STAP-A,
    FU-A, as the packetizer makes them) were cut from (aiortc's depacketizer): what a
    sink taking whole encoded frames (a LiveKit room) is handed."""
    return b"".join(H264PayloadDescriptor.parse(payload)[1] for payload in payloads)
