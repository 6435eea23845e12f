"""Media paths that drive the pipeline: the offline render now, live WebRTC sessions next.

Both run the same per-frame steps (:class:`FramePipeline`): sequence → prepare → model →
compose into yuv420p, then encode.
"""

from streaming.audio_decode import DecodedAudio, decode_audio
from streaming.frame_pipeline import FramePipeline, PreparedFrame
from streaming.offline_render import RenderOptions, RenderResult, render_file

__all__ = [
    "DecodedAudio",
    "FramePipeline",
    "PreparedFrame",
    "RenderOptions",
    "RenderResult",
    "decode_audio",
    "render_file",
]
