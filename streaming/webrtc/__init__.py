"""The WebRTC side of a call, on aiortc: checking offers before aiortc parses them, the
caller's audio handed on as it arrives, the outbound tracks paced by the session clock,
our H.264 encoder, ICE settings, and
(in :mod:`~streaming.webrtc.compat`) every use of aiortc or aioice internals
(``docs/architecture.md`` §6).

Knows nothing of avatars or models; :mod:`streaming.live` builds sessions on it. The
names below load on first use, as in :mod:`streaming`: importing
:mod:`~streaming.webrtc.compat` alone stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streaming.webrtc.audio_receive import ArrivalOrderAudioBuffer
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

_SOURCES = {
    "ArrivalOrderAudioBuffer": "streaming.webrtc.audio_receive",
    "AvatarAudioTrack": "streaming.webrtc.tracks",
    "AvatarVideoTrack": "streaming.webrtc.tracks",
    "EncoderConfig": "streaming.webrtc.encoder_config",
    "EncoderFactory": "streaming.webrtc.video_encoder",
    "LipstreamH264Encoder": "streaming.webrtc.video_encoder",
    "OfferInfo": "streaming.webrtc.offer_check",
    "OfferLimits": "streaming.webrtc.offer_check",
    "OpusChunkEncoder": "streaming.webrtc.tracks",
    "SessionClock": "streaming.webrtc.tracks",
    "check_offer": "streaming.webrtc.offer_check",
    "close_peer_connection": "streaming.webrtc.compat",
}

__all__ = [
    "ArrivalOrderAudioBuffer",
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


def __getattr__(name: str) -> object:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(source), name)
