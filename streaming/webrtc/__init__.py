"""The WebRTC side of a call, on aiortc: checking offers before aiortc parses them, the
outbound tracks paced by the session clock, our H.264 encoder, ICE settings, and
(in :mod:`~streaming.webrtc.compat`) every use of aiortc or aioice internals
(``docs/architecture.md`` §6).

Knows nothing of avatars or models; :mod:`streaming.live` builds sessions on it.
"""

from __future__ import annotations

from streaming.webrtc.compat import close_peer_connection
from streaming.webrtc.encoder_config import EncoderConfig
from streaming.webrtc.offer_check import OfferInfo, OfferLimits, check_offer
from streaming.webrtc.tracks import (
    AvatarAudioTrack,
    AvatarVideoTrack,
    OpusChunkEncoder,
    SessionClock,
)
from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder

__all__ = [
    "AvatarAudioTrack",
    "AvatarVideoTrack",
    "EncoderConfig",
    "EncoderFactory",
    "LipstreamH264Encoder",
    "OfferInfo",
    "OfferLimits",
    "OpusChunkEncoder",
    "SessionClock",
    "check_offer",
    "close_peer_connection",
]
