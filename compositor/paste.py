"""Paste an inferred face back into an I420 frame, with a feathered seam.

The rule is ``docs/design/compositing.md`` §5.

Upstream writes the prediction into the 328 crop, resizes the crop to the face rect and
pastes it hard; users see the edge. We blend the rect's border over ``feather_px`` pixels
instead. Only the rect is converted to I420 and touched; the rest of the frame is never
read or written, so the per-frame cost scales with the face, not the frame.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

import cv2
import numpy as np
import numpy.typing as npt

from compositor.yuv import Frame, Rect, check_rect, frame_size, planes

# Blend weights are fixed-point with this scale: 256 means "all new pixel". 8 fractional
# bits keep u8·w + u8·(256−w) + 128 inside uint16.
_ONE = 256

_U16 = npt.NDArray[np.uint16]


def compose_crop(
    reference_crop: npt.NDArray[np.uint8], prediction: npt.NDArray[np.uint8], border: int
) -> npt.NDArray[np.uint8]:
    """Return a copy of ``reference_crop`` with ``prediction`` written at ``[b:b+S, b:b+S]``.

    ``reference_crop`` is ``(C, C, 3)`` and ``prediction`` ``(S, S, 3)`` with
    ``C == S + 2 * border`` (unet_328: 328 = 320 + 2·4).
    """
    if reference_crop.dtype != np.uint8 or prediction.dtype != np.uint8:
        raise ValueError(f"crops must be uint8, got {reference_crop.dtype} and {prediction.dtype}")
    if reference_crop.ndim != 3 or reference_crop.shape[2] != 3 or prediction.ndim != 3:
        raise ValueError(
            f"expected (C, C, 3) and (S, S, 3) crops, got {reference_crop.shape} "
            f"and {prediction.shape}"
        )
    c_h, c_w = reference_crop.shape[:2]
    s_h, s_w, s_c = prediction.shape
    if border < 0 or s_c != 3 or c_h != c_w or s_h != s_w or c_h != s_h + 2 * border:
        raise ValueError(
            f"prediction {prediction.shape} with border {border} does not fit reference "
            f"crop {reference_crop.shape}; need square crops with C = S + 2*border"
        )
    out = reference_crop.copy()
    out[border : border + s_h, border : border + s_w] = prediction
    return out


def feather_mask(w: int, h: int, feather_px: int) -> npt.NDArray[np.float32]:
    """Return an ``(h, w)`` float32 mask: 0 on the rect's edge pixels, 1 from ``feather_px`` in.

    The ramp is a smoothstep of the distance to the nearest edge, so the seam has no
    visible kink. ``feather_px = 0`` gives all ones (a hard paste). If the rect is smaller
    than twice the feather, its centre never reaches 1.
    """
    if w <= 0 or h <= 0:
        raise ValueError(f"mask size must be positive, got {w}x{h}")
    if feather_px < 0:
        raise ValueError(f"feather_px must be >= 0, got {feather_px}")
    if feather_px == 0:
        return np.ones((h, w), dtype=np.float32)
    ramp_x = _ramp(w, feather_px)
    ramp_y = _ramp(h, feather_px)
    mask: npt.NDArray[np.float32] = np.minimum.outer(ramp_y, ramp_x).astype(np.float32)
    return mask


def _ramp(n: int, feather_px: int) -> npt.NDArray[np.float64]:
    i = np.arange(n, dtype=np.float64)
    t = np.clip(np.minimum(i, n - 1 - i) / feather_px, 0.0, 1.0)
    ramp: npt.NDArray[np.float64] = t * t * (3.0 - 2.0 * t)
    return ramp


@dataclass(frozen=True)
class _PlaneWeights:
    """Fixed-point blend weights for one plane at full strength (alpha = 1)."""

    weights: _U16
    inverse: _U16
    """``_ONE - weights``, cached: it saves one pass per plane per frame."""
    hard: bool
    """All weights are ``_ONE``: blending is a plain copy."""

    @classmethod
    def from_mask(cls, mask: npt.NDArray[np.float32]) -> _PlaneWeights:
        weights = np.rint(mask * _ONE).astype(np.uint16)
        inverse = (_ONE - weights).astype(np.uint16)
        weights.flags.writeable = False
        inverse.flags.writeable = False
        return cls(weights, inverse, hard=bool((weights == _ONE).all()))


@dataclass(frozen=True)
class _RectWeights:
    luma: _PlaneWeights
    chroma: _PlaneWeights


class Paster:
    """Pastes BGR face crops into I420 frames with a feathered seam.

    Holds a bounded LRU of blend weights per rect size (rect sizes repeat, since each
    avatar frame has a fixed rect). Safe to share between executor threads.
    """

    def __init__(self, feather_px: int, *, max_masks: int = 64) -> None:
        if feather_px < 0:
            raise ValueError(f"feather_px must be >= 0, got {feather_px}")
        if max_masks < 1:
            raise ValueError(f"max_masks must be >= 1, got {max_masks}")
        self.feather_px = feather_px
        self._max_masks = max_masks
        self._lock = threading.Lock()
        self._weights: OrderedDict[tuple[int, int], _RectWeights] = OrderedDict()

    @property
    def cached_masks(self) -> int:
        """How many rect sizes currently have cached blend weights (at most ``max_masks``)."""
        with self._lock:
            return len(self._weights)

    def paste(
        self, frame_i420: Frame, rect: Rect, crop_bgr: npt.NDArray[np.uint8], alpha: float = 1.0
    ) -> None:
        """Blend ``crop_bgr`` into ``rect`` of ``frame_i420`` in place.

        The crop (any size, typically the 328 crop from :func:`compose_crop`) is resized
        to the rect with ``INTER_LINEAR`` as upstream does, converted to I420, and blended
        with weight ``alpha · mask`` (chroma uses the mask averaged over 2×2 blocks).
        ``alpha = 0`` leaves the frame untouched; ``alpha = 1`` writes the converted crop
        exactly wherever the mask is 1. ``rect`` must be even-aligned and inside the frame.
        """
        if not 0.0 <= alpha <= 1.0:  # also rejects NaN
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if crop_bgr.dtype != np.uint8 or crop_bgr.ndim != 3 or crop_bgr.shape[2] != 3:
            raise ValueError(
                f"crop must be (h, w, 3) uint8 BGR, got {crop_bgr.dtype} {crop_bgr.shape}"
            )
        if not frame_i420.flags.writeable:
            raise ValueError("frame is read-only; copy the cached background before pasting")
        fw, fh = frame_size(frame_i420)
        check_rect(rect, fw, fh)
        a = round(alpha * _ONE)
        if a == 0:
            return

        x1, y1, x2, y2 = rect
        rw, rh = x2 - x1, y2 - y1
        if crop_bgr.shape[:2] != (rh, rw):
            crop_bgr = cast(
                npt.NDArray[np.uint8],
                cv2.resize(crop_bgr, (rw, rh), interpolation=cv2.INTER_LINEAR),
            )
        src_y, src_u, src_v = planes(
            cast(Frame, cv2.cvtColor(np.ascontiguousarray(crop_bgr), cv2.COLOR_BGR2YUV_I420))
        )
        dst_y, dst_u, dst_v = planes(frame_i420)
        luma_box = (slice(y1, y2), slice(x1, x2))
        chroma_box = (slice(y1 // 2, y2 // 2), slice(x1 // 2, x2 // 2))

        weights = self._rect_weights(rw, rh)
        _blend_plane(dst_y[luma_box], src_y, weights.luma, a)
        _blend_plane(dst_u[chroma_box], src_u, weights.chroma, a)
        _blend_plane(dst_v[chroma_box], src_v, weights.chroma, a)

    def _rect_weights(self, w: int, h: int) -> _RectWeights:
        key = (w, h)
        with self._lock:
            found = self._weights.get(key)
            if found is not None:
                self._weights.move_to_end(key)
                return found
        mask = feather_mask(w, h, self.feather_px)
        chroma = mask.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3), dtype=np.float32)
        built = _RectWeights(_PlaneWeights.from_mask(mask), _PlaneWeights.from_mask(chroma))
        with self._lock:
            self._weights[key] = built
            self._weights.move_to_end(key)
            while len(self._weights) > self._max_masks:
                self._weights.popitem(last=False)
        return built


def _blend_plane(
    dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], pw: _PlaneWeights, a: int
) -> None:
    if a == _ONE:
        if pw.hard:
            np.copyto(dst, src)
        else:
            _blend(dst, src, pw.weights, pw.inverse)
        return
    # Fading: scale the weights by alpha. a < _ONE keeps w·a + 128 inside uint16.
    weights = pw.weights * np.uint16(a)
    weights += _ONE // 2
    weights >>= 8
    _blend(dst, src, weights, _ONE - weights)


def _blend(
    dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], weights: _U16, inverse: _U16
) -> None:
    """``dst = (dst·(256−w) + src·w + 128) >> 8`` in uint16; exact at w = 0 and w = 256.

    One vectorised pass over the whole rect beats blending only the feather band: at
    face size numpy's per-call overhead outweighs the pixels saved (measured).
    """
    acc = dst.astype(np.uint16)
    acc *= inverse
    new = src.astype(np.uint16)
    new *= weights
    acc += new
    acc += _ONE // 2
    acc >>= 8
    np.copyto(dst, acc, casting="unsafe")
