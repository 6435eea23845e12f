"""Media paths that drive the pipeline: live WebRTC calls and the offline render.

    audio_in/   audio apps bring: files, pushed bodies, text-to-speech → 16 kHz PCM
    live/       one call (Session) and all of them (SessionManager, admission)
    webrtc/     aiortc: offers, paced tracks, H.264 encoder, aiortc internals
    offline/    an audio file in, an mp4 out
    frame_pipeline.py   the per-frame steps both share: prepare → model → compose

Imports :mod:`inference_core`, :mod:`compositor` and :mod:`config`; never :mod:`web`
(``docs/design/map.md`` §1).

The names below load on first use (PEP 562), so a process that needs one leaf module,
such as a load-test client that imports only :mod:`streaming.webrtc.compat`, does not
pay for the whole server (onnxruntime, OpenCV and their thread pools).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_SOURCES = {
    "FramePipeline": "streaming.frame_pipeline",
    "OfferError": "streaming.exceptions",
    "PreparedFrame": "streaming.frame_pipeline",
    "RenderOptions": "streaming.offline.render",
    "RenderResult": "streaming.offline.render",
    "Session": "streaming.live.session",
    "SessionLimitError": "streaming.exceptions",
    "SessionManager": "streaming.live.manager",
    "SessionNotFoundError": "streaming.exceptions",
    "StreamingError": "streaming.exceptions",
    "render_file": "streaming.offline.render",
}

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


def __getattr__(name: str) -> object:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(source), name)
