"""A sender made to send H.264 with lipstream's encoder (``docs/design/webrtc.md`` §6).

H.264 is preferred before the caller's offer is applied (:func:`prefer_h264`), the
codec aiortc negotiated is read (:func:`negotiated_codec`), and the sender is given a
:class:`~streaming.webrtc.video_encoder.LipstreamH264Encoder` (:func:`install_encoder`),
whose keyframe requests then come from the caller's PLI and FIR.
"""

from __future__ import annotations

import logging

from aiortc import RTCRtpCodecParameters, RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import is_rtx

from streaming.webrtc.compat import (
    forward_keyframe_requests,
    install_sender_encoder,
    negotiated_codecs,
)
from streaming.webrtc.video_encoder import LipstreamH264Encoder

logger = logging.getLogger(__name__)


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
    forward_keyframe_requests(sender, encoder.peer_requests_keyframe)
    return True
