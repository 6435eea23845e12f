"""Crop rects from other projects' face data: SyncTalk_2D landmarks, LiveTalking boxes.

SyncTalk_2D's rule (its training and inference both use it): with the 110 landmarks of a
frame, x runs from landmark 1 to landmark 31, y starts at landmark 52, and the rect is
square (side = that width). lipstream keeps every rect inside the frame (shifted, never
shrunk) and on even pixels for 4:2:0 chroma, and reports how far either moved a crop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference_core.importers.errors import ImportFailedError

SYNCTALK_LANDMARKS = 110
_LEFT, _RIGHT, _TOP = 1, 31, 52


def read_landmarks(path: Path, points: int = SYNCTALK_LANDMARKS) -> np.ndarray:
    """``points`` ``x y`` lines of a SyncTalk_2D ``.lms`` file as an int ``[points, 2]`` array."""
    try:
        lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportFailedError(f"{path}: cannot be read: {exc}") from exc
    lines = [line for line in lines if line]
    if len(lines) != points:
        raise ImportFailedError(
            f"{path}: {len(lines)} landmark lines, SyncTalk_2D writes {points} (one 'x y' per "
            "point); re-run its landmark detection for this frame"
        )
    try:
        values = np.array([[float(x), float(y)] for x, y in lines])
    except ValueError as exc:
        raise ImportFailedError(f"{path}: a line is not two numbers 'x y': {exc}") from exc
    rounded: np.ndarray = np.rint(values).astype(np.int64)
    return rounded


def synctalk_rect(landmarks: np.ndarray) -> tuple[int, int, int, int]:
    """SyncTalk_2D's crop ``(x1, y1, x2, y2)`` from one frame's landmarks."""
    x1 = int(landmarks[_LEFT][0])
    x2 = int(landmarks[_RIGHT][0])
    y1 = int(landmarks[_TOP][1])
    return x1, y1, x2, y1 + (x2 - x1)


@dataclass(frozen=True)
class FittedRects:
    """Rects inside the frame on even pixels, and how far that moved them."""

    rects: np.ndarray  # int [N, 4] x1, y1, x2, y2
    max_shift_px: int  # largest move of an edge to keep a rect inside the frame
    max_snap_px: int  # largest move of an edge to an even pixel (0 or 1)


def fit_rects(
    raw: np.ndarray, frame_size: tuple[int, int], *, source: str = "rects"
) -> FittedRects:
    """Shift each rect inside the ``(w, h)`` frame, then snap it outwards to even pixels.

    Raises :class:`ImportFailedError` for a rect with no area or larger than the frame.
    """
    w, h = frame_size
    rects = np.asarray(raw, dtype=np.int64).reshape(-1, 4).copy()
    sizes = rects[:, 2:] - rects[:, :2]
    bad = np.nonzero((sizes <= 0).any(axis=1) | (sizes[:, 0] > w) | (sizes[:, 1] > h))[0]
    if len(bad):
        i = int(bad[0])
        raise ImportFailedError(
            f"{source}: frame {i} has rect {rects[i].tolist()}, which is empty or larger than "
            f"the {w}x{h} frame ({len(bad)} such frame(s)); check the face data of that frame"
        )
    before = rects.copy()
    dx = np.maximum(0, -rects[:, 0]) - np.maximum(0, rects[:, 2] - w)
    dy = np.maximum(0, -rects[:, 1]) - np.maximum(0, rects[:, 3] - h)
    rects[:, [0, 2]] += dx[:, None]
    rects[:, [1, 3]] += dy[:, None]
    shifted = rects.copy()
    rects[:, :2] -= rects[:, :2] % 2
    rects[:, 2:] += rects[:, 2:] % 2
    rects[:, 2] = np.minimum(rects[:, 2], w - w % 2)
    rects[:, 3] = np.minimum(rects[:, 3], h - h % 2)
    return FittedRects(
        rects.astype(np.int32),
        int(np.abs(shifted - before).max(initial=0)),
        int(np.abs(rects - shifted).max(initial=0)),
    )
