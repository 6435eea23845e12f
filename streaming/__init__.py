"""Media paths that drive the pipeline: live WebRTC sessions and the offline render.

Both run the same per-frame steps (:class:`FramePipeline`): sequence → prepare → model →
compose into yuv420p, then encode. A live :class:`Session` adds the audio mixer, the
session clock that paces video and audio together, and the H.264 encoder;
:class:`SessionManager` creates sessions from SDP offers and owns what they share.
"""

from streaming.audio_decode import DecodedAudio, decode_audio
from streaming.exceptions import (
    OfferError,
    SessionLimitError,
    SessionNotFoundError,
    StreamingError,
)
from streaming.frame_pipeline import FramePipeline, PreparedFrame
from streaming.offline_render import RenderOptions, RenderResult, render_file
from streaming.session import Session
from streaming.session_manager import SessionManager
from streaming.tts import TtsEngine, build_tts_engine

__all__ = [
    "DecodedAudio",
    "FramePipeline",
    "OfferError",
    "PreparedFrame",
    "RenderOptions",
    "RenderResult",
    "Session",
    "SessionLimitError",
    "SessionManager",
    "SessionNotFoundError",
    "StreamingError",
    "TtsEngine",
    "build_tts_engine",
    "decode_audio",
    "render_file",
]
