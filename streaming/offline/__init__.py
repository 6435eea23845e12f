"""The offline render: an audio file in, an mp4 of the avatar speaking it out, through the
same per-frame steps as a live session but unpaced (``docs/design/audio-in.md`` §2).
"""

from __future__ import annotations

from streaming.offline.render import RenderOptions, RenderResult, render_file

__all__ = [
    "RenderOptions",
    "RenderResult",
    "render_file",
]
