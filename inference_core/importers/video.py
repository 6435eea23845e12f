"""Building an avatar from a video of a person: frames, a face rect per frame, the segment.

The video is decoded at the avatar's fps (PyAV). The face in each frame comes from the
user's ONNX face detector (SCRFD-style outputs, e.g. the 2.5 g KPS model SyncTalk_2D
ships; no weights are bundled or downloaded) or from a rects file. Rects are smoothed
over time; gaps of a few frames without a face are interpolated, longer ones refused
naming the frames.

The avatar plays its frames back and forth (``compositor/sequencer.py``), so there is
no cut where a loop would jump; what shows is the turn at each end. The kept segment is
therefore the one whose two ends move least (frame-to-frame difference), reported with
the import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import cv2
import numpy as np
import onnxruntime as ort

from inference_core.importers.errors import ImportFailedError

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
DETECTOR_HELP = (
    "pass an SCRFD-style ONNX face detector (for example the scrfd_2.5g_kps.onnx that "
    "SyncTalk_2D's data_utils use, or one exported from InsightFace's SCRFD), or --rects "
    "with one [x1, y1, x2, y2] face box per frame"
)
_THUMB = (64, 36)


def decode_frames(path: Path, fps: int) -> Iterator[np.ndarray]:
    """BGR frames of the video's first video stream, resampled to ``fps`` by timestamp."""
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as exc:
        raise ImportFailedError(f"{path}: not a readable video: {exc}") from exc
    with container:
        if not container.streams.video:
            raise ImportFailedError(f"{path}: has no video stream")
        next_time = 0.0
        try:
            for frame in container.decode(video=0):
                t = float(frame.time or 0.0)
                if t + 0.5 / fps < next_time:
                    continue  # the source runs faster than the avatar: skip
                image = frame.to_ndarray(format="bgr24")
                while next_time <= t + 0.5 / fps:  # slower source: repeat
                    yield image
                    next_time += 1.0 / fps
        except av.FFmpegError as exc:
            raise ImportFailedError(f"{path}: decoding failed: {exc}") from exc


class FaceDetector:
    """An SCRFD-style ONNX face detector: per stride, scores ``[N,1]`` and box distances
    ``[N,4]`` (keypoints ``[N,10]`` ignored), anchors on a grid of that stride."""

    def __init__(self, path: Path, *, size: int = 640, threshold: float = 0.5) -> None:
        try:
            self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises bare RuntimeError/Fail
            raise ImportFailedError(f"{path}: not a loadable ONNX model: {exc}") from exc
        inputs = self.session.get_inputs()
        outputs = [(o.name, o.shape[-1]) for o in self.session.get_outputs()]
        scores = [name for name, last in outputs if last == 1]
        boxes = [name for name, last in outputs if last == 4]
        if len(inputs) != 1 or not scores or len(scores) != len(boxes):
            found = ", ".join(f"{o.name}{o.shape}" for o in self.session.get_outputs())
            raise ImportFailedError(
                f"{path}: outputs {found} are not SCRFD-style (per stride a [N,1] score and a "
                f"[N,4] box output); {DETECTOR_HELP}"
            )
        self.input_name = inputs[0].name
        self.scores, self.boxes = scores, boxes
        self.size = size
        self.threshold = threshold

    def detect(self, image: np.ndarray) -> tuple[float, float, float, float, float] | None:
        """The most confident face ``(x1, y1, x2, y2, score)`` in frame pixels, or None."""
        h, w = image.shape[:2]
        scale = self.size / max(h, w)
        resized = cv2.resize(image, (round(w * scale), round(h * scale)))
        canvas = np.zeros((self.size, self.size, 3), dtype=np.float32)
        canvas[: resized.shape[0], : resized.shape[1]] = resized[:, :, ::-1]  # RGB
        blob = ((canvas - 127.5) / 128.0).transpose(2, 0, 1)[None]
        results = self.session.run(self.scores + self.boxes, {self.input_name: blob})
        levels = len(self.scores)
        best: tuple[float, float, float, float, float] | None = None
        for level in range(levels):
            score = np.asarray(results[level]).reshape(-1)
            distance = np.asarray(results[levels + level]).reshape(-1, 4)
            i = int(np.argmax(score))
            if score[i] < self.threshold or (best is not None and score[i] <= best[4]):
                continue
            stride = self._stride(len(score))
            cells = (self.size // stride) ** 2
            anchors = len(score) // cells
            cell = i // anchors
            cx, cy = (
                (cell % (self.size // stride)) * stride,
                (cell // (self.size // stride)) * stride,
            )
            d = distance[i] * stride
            best = (
                (cx - d[0]) / scale,
                (cy - d[1]) / scale,
                (cx + d[2]) / scale,
                (cy + d[3]) / scale,
                float(score[i]),
            )
        return best

    def _stride(self, count: int) -> int:
        for stride in (8, 16, 32, 64, 128):
            cells = (self.size // stride) ** 2
            if count % cells == 0 and count // cells in (1, 2, 3):
                return stride
        raise ImportFailedError(f"detector output of {count} anchors fits no stride of 8..128")


def crop_rect(box: tuple[float, float, float, float]) -> tuple[float, float, float]:
    """A face box → the crop's centre x, centre y and side (square).

    Close to SyncTalk_2D's landmark crop: as wide as the face, its bottom a little below
    the chin, so mouth, nose and eyes are inside. For SyncTalk_2D's exact crop, train on
    ``--prepare-synctalk`` output and import the dataset with ``import synctalk2d``.
    """
    x1, _, x2, y2 = box
    side = x2 - x1
    bottom = y2 + 0.05 * side
    return (x1 + x2) / 2, bottom - side / 2, side


def fill_gaps(centres: list[tuple[float, float, float] | None], max_gap: int) -> np.ndarray:
    """Interpolate runs of up to ``max_gap`` frames without a face; refuse longer ones."""
    known = [i for i, c in enumerate(centres) if c is not None]
    if not known:
        raise ImportFailedError(f"no face found in any frame; {DETECTOR_HELP}")
    values = np.array([c for c in centres if c is not None], dtype=np.float64)
    missing = [i for i, c in enumerate(centres) if c is None]
    runs: list[tuple[int, int]] = []
    for i in missing:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    long = [(a, b) for a, b in runs if b - a + 1 > max_gap]
    if long:
        shown = ", ".join(f"{a}-{b}" for a, b in long[:5])
        raise ImportFailedError(
            f"no face in frames {shown} ({len(long)} run(s) longer than {max_gap} frames); "
            "cut those parts from the video or pass --rects"
        )
    index = np.arange(len(centres))
    return np.stack([np.interp(index, known, values[:, k]) for k in range(3)], axis=1)


def smooth(track: np.ndarray, window: int = 5) -> np.ndarray:
    """Centred moving average of each column (edges use the frames they have)."""
    if window <= 1 or len(track) < 3:
        return track
    kernel = np.ones(window) / window
    padded = np.pad(track, ((window // 2, window // 2), (0, 0)), mode="edge")
    return np.stack([np.convolve(padded[:, k], kernel, mode="valid") for k in range(3)], axis=1)


@dataclass(frozen=True)
class Segment:
    """The kept frames ``[start, stop)`` and the motion at their two ends."""

    start: int
    stop: int
    end_motion: float  # mean absolute grey-level change at the two turns, 0-255


def quietest_segment(
    thumbs: np.ndarray, min_frames: int, covering: tuple[int, int] | None = None
) -> Segment:
    """The segment of at least ``min_frames`` whose two ends move least; with
    ``covering`` ``(first, stop)``, among those that hold frames ``[first, stop)``."""
    n = len(thumbs)
    first, last = (n, 0) if covering is None else covering
    if n <= min_frames:
        return Segment(0, n, 0.0)
    motion = np.abs(np.diff(thumbs.astype(np.float32), axis=0)).mean(axis=(1, 2))
    at = np.concatenate([[motion[0]], (motion[:-1] + motion[1:]) / 2, [motion[-1]]])
    best = Segment(0, n, float(at[0] + at[n - 1]) / 2)
    for start in range(0, min(n - min_frames, first) + 1):
        stops = np.arange(max(start + min_frames, last), n + 1)
        cost = (at[start] + at[stops - 1]) / 2
        k = int(np.argmin(cost))
        if cost[k] < best.end_motion:
            best = Segment(start, int(stops[k]), float(cost[k]))
    return best


def thumbnail(image: np.ndarray) -> np.ndarray:
    """A small grey copy of a frame for comparing motion."""
    small: np.ndarray = cv2.resize(
        cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), _THUMB, interpolation=cv2.INTER_AREA
    )
    return small
