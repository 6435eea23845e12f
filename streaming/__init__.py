"""Media paths that drive the pipeline: live WebRTC calls and the offline render.

    audio_in/   audio apps bring: files, pushed bodies, text-to-speech → 16 kHz PCM
    live/       one call (Session) and all of them (SessionManager, admission)
    webrtc/     aiortc: offers, paced outbound tracks, H.264 encoder, aiortc internals
    offline/    an audio file in, an mp4 out
    frame_pipeline.py   the per-frame steps both share: prepare → model → compose

Imports :mod:`inference_core`, :mod:`compositor` and :mod:`config`; never :mod:`web`
(``docs/architecture.md`` §1).
"""

from __future__ import annotations

from streaming.exceptions import (
    OfferError,
    SessionLimitError,
    SessionNotFoundError,
    StreamingError,
)
from streaming.frame_pipeline import FramePipeline, PreparedFrame
from streaming.live.manager import SessionManager
from streaming.live.session import Session
from streaming.offline.render import RenderOptions, RenderResult, render_file

__all__ = [
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
    "render_file",
]
