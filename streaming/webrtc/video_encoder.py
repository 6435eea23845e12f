"""H.264 encoding of the outgoing avatar video, tuned for real time.

aiortc encodes H.264 with libx264 at its own fixed settings (no preset, so x264's
"medium"; 1 Mbit/s clamped to 0.5–3 Mbit/s; a 1/30 s time base). That costs ≈14 ms per
720p frame on a 2-core CPU (``docs/architecture.md`` §6), too much with many sessions
per machine. This module keeps aiortc's H.264 packetizer, ``target_bitrate`` and REMB handling by
subclassing its ``H264Encoder``, opens the codec with our options instead
(:mod:`~streaming.webrtc.encoder_config`), picks NVENC
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
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import av
import numpy as np
from aiortc import RTCRtpCodecParameters, RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import is_rtx
from aiortc.codecs.h264 import H264Encoder
from av.video.codeccontext import VideoCodecContext
from av.video.frame import PictureType

from config.settings import VideoSettings
from streaming.webrtc.compat import (
    forward_keyframe_requests,
    install_sender_encoder,
    negotiated_codecs,
)
from streaming.webrtc.encoder_config import TIME_BASE, CodecName, EncoderConfig, open_codec

logger = logging.getLogger(__name__)

_PROBE_SIZE = (256, 144)


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
        self._keyframe_wanted = False

    def request_keyframe(self) -> None:
        """The receiver lost the picture (PLI/FIR): the next frame encoded is an IDR.

        aiortc passes its own flag only to frames it encodes itself; frames handed to it
        encoded (:meth:`encode_packet`) learn of the request here (see
        :func:`~streaming.webrtc.compat.forward_keyframe_requests`).
        """
        self._keyframe_wanted = True

    @property
    def keyframe_wanted(self) -> bool:
        """Whether a keyframe request (or a switch back from a shared idle loop) waits."""
        return self._keyframe_wanted

    def take_keyframe_request(self) -> None:
        """A keyframe was sent without this encoder (a shared idle loop's IDR): the
        request is answered."""
        self._keyframe_wanted = False

    def encode_packet(self, frame: av.VideoFrame) -> av.Packet[Any]:
        """Encode and packetise ``frame`` off the event loop, for the sender to send as is.

        Returns an empty ``av.Packet`` stamped with the frame's RTP time (1/90000) whose
        ``opaque`` holds the RTP payloads; :meth:`pack` hands them to aiortc's sender, so
        the loop does no H.264 work and no thread hand-off of its own for the frame
        (``docs/architecture.md`` §6). Frames of one stream are encoded one at a time, in
        order (the video track awaits each before asking for the next).
        """
        force, self._keyframe_wanted = self._keyframe_wanted, False
        payloads, timestamp = self.encode(frame, force)
        packet = av.Packet(b"")
        packet.pts = timestamp
        packet.time_base = TIME_BASE
        packet.opaque = payloads
        return packet

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
            # A call that switched to an avatar of another size (docs/architecture.md §18).
            logger.info(
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
    sender: RTCRtpSender, encoder: LipstreamH264Encoder, codec: RTCRtpCodecParameters
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
    forward_keyframe_requests(sender, encoder.request_keyframe)
    return True
