"""The dissolve from one avatar to another when a call switches (``docs/design/switching.md`` §18).

Both pictures are I420 frames (:mod:`compositor.yuv`); a linear mix of the planes is the
mix of the pictures, so no colour conversion is needed. The outgoing avatar's frame is
scaled to the incoming one's size first: the new size is the stream's from the switch on
(the encoder reopens at it), and the old picture shrinks or grows into it while it fades.
"""

from __future__ import annotations

import cv2
import numpy as np

from compositor.yuv import Frame, frame_size, resize_i420


def fade_weight(position: int, frames: int) -> float:
    """Weight of the incoming avatar at ``position`` (0 = the switch frame) of a dissolve
    lasting ``frames`` frames: rises evenly, never 0 (the switch frame already shows the
    new avatar a little) and 1 only after the dissolve."""
    if frames <= 0 or position >= frames:
        return 1.0
    return (max(position, 0) + 1) / (frames + 1)


def crossfade(outgoing: Frame, incoming: Frame, weight: float) -> Frame:
    """``incoming`` × ``weight`` + ``outgoing`` × (1 − ``weight``), at ``incoming``'s size.

    Returns a fresh frame (never one of the inputs, which may be cached read-only arrays).
    """
    width, height = frame_size(incoming)
    if frame_size(outgoing) != (width, height):
        outgoing = resize_i420(outgoing, width, height)
    mixed = cv2.addWeighted(incoming, float(weight), outgoing, 1.0 - float(weight), 0.0)
    return np.ascontiguousarray(mixed)
