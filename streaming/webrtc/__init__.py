"""The WebRTC side of a call, on aiortc, and the only package that imports aiortc:
the :class:`Peer` that owns a caller's peer connection (the answer, its state, its
figures, its data channel), checking offers before aiortc parses them, the caller's
audio handed on as it arrives, the outbound tracks paced by the session clock, our
H.264 encoder, ICE settings, and (in :mod:`~streaming.webrtc.compat`) every use of
aiortc or aioice internals (``docs/design/map.md`` §1, ``docs/design/webrtc.md`` §6).

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
    from streaming.webrtc.data_channel import EventChannel
    from streaming.webrtc.encoder_config import EncoderConfig
    from streaming.webrtc.ice import ice_configuration
    from streaming.webrtc.offer_check import OfferInfo, OfferLimits, check_offer
    from streaming.webrtc.pacing import SessionClock
    from streaming.webrtc.peer import Peer, PeerMedia, PeerState
    from streaming.webrtc.tracks import AvatarAudioTrack, AvatarVideoTrack, OpusChunkEncoder
    from streaming.webrtc.video_encoder import EncoderFactory, LipstreamH264Encoder

_SOURCES = {
    "ArrivalOrderAudioBuffer": "streaming.webrtc.audio_receive",
    "AvatarAudioTrack": "streaming.webrtc.tracks",
    "AvatarVideoTrack": "streaming.webrtc.tracks",
    "EncoderConfig": "streaming.webrtc.encoder_config",
    "EventChannel": "streaming.webrtc.data_channel",
    "EncoderFactory": "streaming.webrtc.video_encoder",
    "LipstreamH264Encoder": "streaming.webrtc.video_encoder",
    "OfferInfo": "streaming.webrtc.offer_check",
    "OfferLimits": "streaming.webrtc.offer_check",
    "OpusChunkEncoder": "streaming.webrtc.tracks",
    "Peer": "streaming.webrtc.peer",
    "PeerMedia": "streaming.webrtc.peer",
    "PeerState": "streaming.webrtc.peer",
    "SessionClock": "streaming.webrtc.pacing",
    "check_offer": "streaming.webrtc.offer_check",
    "close_peer_connection": "streaming.webrtc.compat",
    "ice_configuration": "streaming.webrtc.ice",
}

__all__ = [
    "ArrivalOrderAudioBuffer",
    "AvatarAudioTrack",
    "AvatarVideoTrack",
    "EncoderConfig",
    "EncoderFactory",
    "EventChannel",
    "LipstreamH264Encoder",
    "OfferInfo",
    "OfferLimits",
    "OpusChunkEncoder",
    "Peer",
    "PeerMedia",
    "PeerState",
    "SessionClock",
    "check_offer",
    "close_peer_connection",
    "ice_configuration",
]


def __getattr__(name: str) -> object:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(source), name)
