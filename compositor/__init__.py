"""From model output to video frame: background frames, paste-back, frame sequencing and
the avatar's clips (which frame a call shows).

Frames are kept as yuv420p (I420) arrays, the encoder's own format, so no full-frame
colour conversion happens per output frame; only the pasted face region is converted.
"""

from compositor.background_cache import AvatarFrames, BackgroundCache, CacheStats
from compositor.clips import Clip, ClipNotFoundError, ClipPlan, FrameDistance, bounce_index
from compositor.exceptions import CompositorError, FrameLoadError
from compositor.frame_similarity import FrameThumbnails
from compositor.paste import Paster, compose_crop, feather_mask
from compositor.sequencer import FrameSequencer, FrameStep
from compositor.yuv import (
    Frame,
    Rect,
    bgr_to_i420,
    check_rect,
    crop_bgr,
    even_rect,
    frame_size,
    i420_to_bgr,
    planes,
    resize_i420,
)

__all__ = [
    "AvatarFrames",
    "BackgroundCache",
    "CacheStats",
    "Clip",
    "ClipNotFoundError",
    "ClipPlan",
    "CompositorError",
    "Frame",
    "FrameDistance",
    "FrameLoadError",
    "FrameSequencer",
    "FrameStep",
    "FrameThumbnails",
    "Paster",
    "Rect",
    "bgr_to_i420",
    "bounce_index",
    "check_rect",
    "compose_crop",
    "crop_bgr",
    "even_rect",
    "feather_mask",
    "frame_size",
    "i420_to_bgr",
    "planes",
    "resize_i420",
]
