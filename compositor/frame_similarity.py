"""How alike two avatar frames look, from small grey thumbnails (``docs/design/compositing.md`` §5).

A clip is entered at the frame nearest to the one shown before it
(:class:`compositor.clips.ClipPlan`); nearest means the smallest mean absolute difference
of 32×32 grey thumbnails, in grey levels (0-255). :meth:`FrameThumbnails.max_step` is the
avatar's own frame-to-frame motion: a clip change that moves no more than that does not
show as a jump.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import numpy.typing as npt

THUMB_SIZE = 32


def thumbnail(frame: np.ndarray, size: int = THUMB_SIZE) -> npt.NDArray[np.float32]:
    """A ``size``×``size`` float32 grey thumbnail of a yuv420p (I420, ``[h*3/2, w]``)
    frame, its luma plane (studio range), or of a BGR ``[h, w, 3]`` frame (full-range
    grey): build one avatar's thumbnails from one kind of frame."""
    if frame.ndim == 3:
        grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
    elif frame.ndim == 2 and frame.shape[0] % 3 == 0:
        grey = frame[: frame.shape[0] * 2 // 3]  # I420: the Y plane comes first
    else:
        raise ValueError(f"expected an I420 [h*3/2, w] or BGR [h, w, 3] frame, got {frame.shape}")
    small = cv2.resize(np.ascontiguousarray(grey), (size, size), interpolation=cv2.INTER_AREA)
    return np.asarray(small, dtype=np.float32)


class FrameThumbnails:
    """One thumbnail per avatar frame; immutable once built (safe to share between calls)."""

    def __init__(self, thumbs: npt.NDArray[np.float32]) -> None:
        if thumbs.ndim != 3 or len(thumbs) < 1:
            raise ValueError(f"thumbnails must be [N, h, w] with N >= 1, got {thumbs.shape}")
        self._thumbs = np.asarray(thumbs, dtype=np.float32)
        self._thumbs.flags.writeable = False

    @classmethod
    def build(
        cls, count: int, get: Callable[[int], np.ndarray], size: int = THUMB_SIZE
    ) -> FrameThumbnails:
        """Thumbnails of frames ``get(0)`` … ``get(count - 1)`` (e.g. ``AvatarFrames.get``,
        which returns I420). Decodes every frame: run it off the event loop."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        return cls(np.stack([thumbnail(get(i), size) for i in range(count)]))

    def __len__(self) -> int:
        return len(self._thumbs)

    def distance(self, a: int, b: int) -> float:
        """Mean absolute difference of frames ``a`` and ``b``'s thumbnails, 0-255."""
        return float(np.abs(self._thumbs[a] - self._thumbs[b]).mean())

    def max_step(self, start: int = 0, stop: int | None = None) -> float:
        """The largest distance between consecutive frames of the bounce over frames
        ``[start, stop)`` (default all): the avatar's own frame-to-frame motion."""
        part = self._thumbs[start : len(self._thumbs) if stop is None else stop]
        if len(part) < 2:
            return 0.0
        return float(np.abs(np.diff(part, axis=0)).mean(axis=(1, 2)).max())
