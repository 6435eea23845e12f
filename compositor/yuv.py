"""Frames kept in the encoder's pixel format (I420 / yuv420p).

A frame is one contiguous ``uint8`` array of shape ``(h * 3 // 2, w)``: the Y plane
(``h × w``), then U (``h/2 × w/2``), then V (``h/2 × w/2``), each flattened in order.
That is exactly what ``av.VideoFrame.from_ndarray(arr, format="yuv420p")`` takes, so the
encoder needs no full-frame colour conversion; only the pasted face region is converted
(``docs/design/compositing.md`` §5). Width and height must be even.
"""

from __future__ import annotations

from typing import cast

import cv2
import numpy as np
import numpy.typing as npt

Frame = npt.NDArray[np.uint8]
"""An I420 frame, ``(h * 3 // 2, w)`` uint8."""

Rect = tuple[int, int, int, int]
"""``(x1, y1, x2, y2)`` in pixels, ``x2``/``y2`` exclusive."""


def bgr_to_i420(bgr: npt.NDArray[np.uint8]) -> Frame:
    """Convert an ``(h, w, 3)`` BGR image with even ``w`` and ``h`` to an I420 frame."""
    if bgr.ndim != 3 or bgr.shape[2] != 3 or bgr.dtype != np.uint8:
        raise ValueError(f"expected an (h, w, 3) uint8 BGR image, got {bgr.dtype} {bgr.shape}")
    h, w = bgr.shape[:2]
    if h % 2 or w % 2 or h == 0 or w == 0:
        raise ValueError(f"I420 needs a non-empty image with even width and height, got {w}x{h}")
    return np.ascontiguousarray(cast(Frame, cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)))


def i420_to_bgr(frame: Frame) -> npt.NDArray[np.uint8]:
    """Convert an I420 frame to an ``(h, w, 3)`` BGR image."""
    frame_size(frame)  # validates the layout
    return cast(npt.NDArray[np.uint8], cv2.cvtColor(frame, cv2.COLOR_YUV2BGR_I420))


def frame_size(frame: Frame) -> tuple[int, int]:
    """Return ``(w, h)`` of an I420 frame, checking its layout."""
    if frame.ndim != 2 or frame.dtype != np.uint8:
        raise ValueError(f"expected a 2-D uint8 I420 frame, got {frame.dtype} {frame.shape}")
    rows, w = frame.shape
    if rows % 3:
        raise ValueError(f"I420 frame has {rows} rows; expected h * 3 / 2 rows")
    h = rows * 2 // 3
    if h % 2 or w % 2 or h == 0 or w == 0:
        raise ValueError(f"I420 frame must be non-empty with even width and height, got {w}x{h}")
    return w, h


def planes(frame: Frame) -> tuple[Frame, Frame, Frame]:
    """Return writable 2-D views ``(y, u, v)`` into ``frame``.

    ``y`` is ``h × w``; ``u`` and ``v`` are ``h/2 × w/2``. Writes go through to ``frame``.
    """
    w, h = frame_size(frame)
    if not frame.flags.c_contiguous:
        raise ValueError("I420 frame must be C-contiguous to expose plane views")
    flat = frame.reshape(-1)
    y_size = w * h
    c_size = y_size // 4
    y = flat[:y_size].reshape(h, w)
    u = flat[y_size : y_size + c_size].reshape(h // 2, w // 2)
    v = flat[y_size + c_size :].reshape(h // 2, w // 2)
    return y, u, v


def resize_i420(frame: Frame, width: int, height: int) -> Frame:
    """``frame`` scaled plane by plane to ``width`` × ``height`` (both even), by area
    averaging: a new frame (a call's smaller ladder step, a dissolve's outgoing picture)."""
    out = np.empty((height * 3 // 2, width), np.uint8)
    for source, target in zip(planes(np.ascontiguousarray(frame)), planes(out), strict=True):
        size = (target.shape[1], target.shape[0])
        target[...] = cv2.resize(source, size, interpolation=cv2.INTER_AREA)
    return out


def check_rect(rect: Rect, frame_w: int, frame_h: int) -> None:
    """Raise ``ValueError`` unless ``rect`` is non-empty, even-aligned and inside the frame."""
    x1, y1, x2, y2 = rect
    if x1 % 2 or y1 % 2 or x2 % 2 or y2 % 2:
        raise ValueError(
            f"rect {rect} is not even-aligned; 4:2:0 chroma needs even coordinates "
            "(snap it with even_rect())"
        )
    if not (0 <= x1 < x2 <= frame_w and 0 <= y1 < y2 <= frame_h):
        raise ValueError(f"rect {rect} is empty or outside the {frame_w}x{frame_h} frame")


def crop_bgr(frame: Frame, rect: Rect) -> npt.NDArray[np.uint8]:
    """Convert only ``rect`` of an I420 frame to BGR; returns ``(y2-y1, x2-x1, 3)`` uint8.

    ``rect`` must be even-aligned so it covers whole 2×2 chroma blocks.
    """
    w, h = frame_size(frame)
    check_rect(rect, w, h)
    x1, y1, x2, y2 = rect
    y, u, v = planes(frame)
    rw, rh = x2 - x1, y2 - y1
    small = np.empty((rh * 3 // 2, rw), dtype=np.uint8)
    sy, su, sv = planes(small)
    sy[...] = y[y1:y2, x1:x2]
    su[...] = u[y1 // 2 : y2 // 2, x1 // 2 : x2 // 2]
    sv[...] = v[y1 // 2 : y2 // 2, x1 // 2 : x2 // 2]
    return cast(npt.NDArray[np.uint8], cv2.cvtColor(small, cv2.COLOR_YUV2BGR_I420))


def even_rect(rect: Rect, frame_w: int, frame_h: int) -> Rect:
    """Snap ``rect`` outward to even coordinates and clamp it inside the frame.

    Raises ``ValueError`` for an odd frame size or a rect that is empty after clamping.
    """
    if frame_w % 2 or frame_h % 2:
        raise ValueError(f"frame size must be even, got {frame_w}x{frame_h}")
    x1, y1, x2, y2 = (int(c) for c in rect)
    # Outward snapping never cuts off part of the face the rect was meant to cover.
    x1 = min(max(x1 - x1 % 2, 0), frame_w)
    y1 = min(max(y1 - y1 % 2, 0), frame_h)
    x2 = min(max(x2 + x2 % 2, 0), frame_w)
    y2 = min(max(y2 + y2 % 2, 0), frame_h)
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"rect {rect} does not overlap the {frame_w}x{frame_h} frame")
    return x1, y1, x2, y2
