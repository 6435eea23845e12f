"""The built-in ``demo`` avatar: a procedurally drawn person plus the stand-in models.

Lets anyone run lipstream without downloading a person video or trained weights. The
frames are drawn with OpenCV (head sway, blinks, a closed mouth), the crop rects follow
the drawn face exactly, and the models are the stand-ins of
:mod:`inference_core.assets.demo_models`, which open a mouth where this module draws one.
Everything is deterministic: the same arguments write byte-identical files.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from inference_core.assets.demo_models import (
    DEFAULT_MOUTH_CENTER,
    DEFAULT_MOUTH_HALF_WIDTH,
    build_audio_encoder,
    build_lipsync_model,
)
from inference_core.avatars.exceptions import AvatarError

logger = logging.getLogger(__name__)

# Bump when the generated package changes, so existing caches are not reused.
DEMO_PACKAGE_VERSION = "demo-v1"
COMPLETE_MARKER = ".complete"
FPS = 25
FRAME_COUNT = 125
FRAME_SIZE = (1280, 720)
JPEG_QUALITY = 92
# Temp dirs older than this are leftovers of a crashed generator, not a live one.
STALE_TEMP_S = 3600.0

_CROP_SIZE = 328
_CROP_BORDER = 4
_INPUT_SIZE = 320
_SHIFT = 4  # cv2 fixed-point bits: draw at 1/16 px so slow motion does not jitter
_AA = cv2.LINE_AA

_SKIN = (128, 165, 222)
_SKIN_SHADE = (105, 140, 196)
_HAIR = (32, 44, 66)
_SHIRT = (118, 78, 42)
_LIPS = (84, 77, 162)
_LIP_LINE = (45, 40, 95)
_IRIS = (52, 88, 58)
_BROW = (36, 48, 70)


class FaceFrame(NamedTuple):
    """One drawn frame: BGR image, crop rect ``(x1, y1, x2, y2)`` and where features are."""

    image: np.ndarray
    rect: tuple[int, int, int, int]
    mouth: tuple[float, float]
    eyes: tuple[tuple[float, float], tuple[float, float]]
    eye_closure: float


def _p(x: float, y: float) -> tuple[int, int]:
    return (round(x * (1 << _SHIFT)), round(y * (1 << _SHIFT)))


def _ellipse(
    img: np.ndarray,
    center: tuple[float, float],
    axes: tuple[float, float],
    color: tuple[int, int, int],
    thickness: int = -1,
    *,
    angle: float = 0.0,
    arc: tuple[float, float] = (0.0, 360.0),
) -> None:
    cv2.ellipse(img, _p(*center), _p(*axes), angle, arc[0], arc[1], color, thickness, _AA, _SHIFT)


def _poly(img: np.ndarray, points: np.ndarray, color: tuple[int, int, int]) -> None:
    fixed = np.round(points * (1 << _SHIFT)).astype(np.int32)
    cv2.fillPoly(img, [fixed], color, _AA, _SHIFT)


def _blend_ellipse(
    img: np.ndarray,
    center: tuple[float, float],
    axes: tuple[float, float],
    color: tuple[int, int, int],
    alpha: float,
) -> None:
    """Translucent ellipse (blush, shadows), blended only inside its bounding box."""
    h, w = img.shape[:2]
    x0, x1 = max(0, int(center[0] - axes[0]) - 2), min(w, int(center[0] + axes[0]) + 3)
    y0, y1 = max(0, int(center[1] - axes[1]) - 2), min(h, int(center[1] + axes[1]) + 3)
    if x0 >= x1 or y0 >= y1:
        return
    roi = img[y0:y1, x0:x1]
    layer = roi.copy()
    _ellipse(layer, (center[0] - x0, center[1] - y0), axes, color)
    cv2.addWeighted(layer, alpha, roi, 1.0 - alpha, 0.0, dst=roi)


def _background(size: tuple[int, int]) -> np.ndarray:
    """Vertical blue-grey gradient with a soft light spot behind the head."""
    w, h = size
    ys = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    top = np.array([205, 188, 170], dtype=np.float32)
    bottom = np.array([150, 132, 116], dtype=np.float32)
    grad = top * (1.0 - ys) + bottom * ys
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    spot = np.exp(-(((xx - w * 0.5) / (w * 0.35)) ** 2 + ((yy - h * 0.4) / (h * 0.45)) ** 2))
    img = grad * np.ones((1, w, 1), dtype=np.float32) + 22.0 * spot[..., None]
    out: np.ndarray = np.clip(img + 0.5, 0, 255).astype(np.uint8)
    return out


def _blink_closures(count: int, rng: np.random.Generator) -> np.ndarray:
    """Eyelid closure per frame: a blink every 2.2-3 s, closing over 2 frames, opening over 2."""
    closure = np.zeros(count, dtype=np.float64)
    profile = (0.55, 1.0, 0.6, 0.2)
    start = int(rng.integers(12, 24))
    while start < count:
        for k, value in enumerate(profile):
            if start + k < count:
                closure[start + k] = value
        start += int(rng.integers(55, 76))
    return closure


def crop_rect_for_mouth(
    mouth: tuple[float, float], side: float, size: tuple[int, int]
) -> tuple[int, int, int, int]:
    """Even-aligned square rect that puts ``mouth`` at the lip-sync model's mouth centre.

    The rect is resized to 328×328 and the model sees the inner 320×320, so the mouth
    sits at ``border + center * 320`` of 328 along each axis.
    """
    w, h = size
    s = max(8, 2 * round(side / 2))
    fx = (_CROP_BORDER + DEFAULT_MOUTH_CENTER[0] * _INPUT_SIZE) / _CROP_SIZE
    fy = (_CROP_BORDER + DEFAULT_MOUTH_CENTER[1] * _INPUT_SIZE) / _CROP_SIZE
    x1 = min(max(0, 2 * round((mouth[0] - fx * s) / 2)), (w - s) // 2 * 2)
    y1 = min(max(0, 2 * round((mouth[1] - fy * s) / 2)), (h - s) // 2 * 2)
    return (x1, y1, x1 + s, y1 + s)


def _draw_eye(
    img: np.ndarray, c: tuple[float, float], u: float, closure: float, gaze: float
) -> None:
    ex, ey = c
    ew, eh = 19.0 * u, 9.5 * u
    _ellipse(img, (ex, ey), (ew, eh), (238, 242, 245))
    _ellipse(img, (ex + gaze, ey), (8.0 * u, 8.0 * u), _IRIS)
    _ellipse(img, (ex + gaze, ey), (3.6 * u, 3.6 * u), (20, 20, 24))
    _ellipse(img, (ex + gaze + 2.5 * u, ey - 2.5 * u), (1.6 * u, 1.6 * u), (250, 250, 250))
    if closure > 0.0:
        # Upper lid: a skin ellipse sliding down over the eye, its edge a dark lash line.
        lid_cy = ey - 2.2 * eh * (1.0 - closure)
        _ellipse(img, (ex, lid_cy), (ew * 1.2, eh * 1.2), _SKIN)
        lash_cy = min(lid_cy, ey)
        _ellipse(img, (ex, lash_cy), (ew, eh * 1.2), _LIP_LINE, 2, arc=(15.0, 165.0))
    else:
        _ellipse(img, (ex, ey), (ew, eh), _LIP_LINE, 2, arc=(195.0, 345.0))
    _ellipse(img, (ex, ey - 5.0 * u), (ew * 1.05, eh * 1.1), _SKIN_SHADE, 1, arc=(205.0, 335.0))


def _draw_frame(
    background: np.ndarray, hx: float, hy: float, scale: float, closure: float, gaze: float
) -> FaceFrame:
    img = background.copy()
    size = (img.shape[1], img.shape[0])
    u = scale * 1.05  # one drawing unit in px
    head_w, head_h = 118.0 * u, 150.0 * u
    # Shoulders and neck first, the head covers their top.
    _ellipse(img, (hx, hy + 330.0 * u), (300.0 * u, 150.0 * u), _SHIRT)
    _poly(
        img,
        np.array(
            [
                [hx - 48 * u, hy + 90 * u],
                [hx + 48 * u, hy + 90 * u],
                [hx + 56 * u, hy + 200 * u],
                [hx - 56 * u, hy + 200 * u],
            ]
        ),
        _SKIN_SHADE,
    )
    _ellipse(img, (hx, hy + 196 * u), (58 * u, 22 * u), _SKIN_SHADE, arc=(0.0, 180.0))
    _ellipse(img, (hx, hy - 30 * u), (head_w + 12 * u, head_h + 4 * u), _HAIR)  # back hair
    for side in (-1.0, 1.0):
        _ellipse(img, (hx + side * head_w * 0.98, hy + 8 * u), (15 * u, 28 * u), _SKIN_SHADE)
    # Egg-shaped head: narrower towards the chin.
    theta = np.linspace(0.0, 2.0 * np.pi, 120, endpoint=False)
    narrowing = 1.0 - 0.2 * np.clip(np.sin(theta), 0.0, None) ** 2
    outline = np.stack(
        [hx + head_w * np.cos(theta) * narrowing, hy + head_h * np.sin(theta)], axis=1
    )
    _poly(img, outline, _SKIN)
    # Fringe over the forehead.
    _ellipse(img, (hx + 10 * u, hy - 118 * u), (head_w * 0.98, 52 * u), _HAIR, angle=-4.0)
    for side in (-1.0, 1.0):
        _blend_ellipse(
            img, (hx + side * 62 * u, hy + 48 * u), (24 * u, 14 * u), (110, 120, 235), 0.25
        )

    eyes = ((hx - 45.0 * u, hy - 12.0 * u), (hx + 45.0 * u, hy - 12.0 * u))
    for eye in eyes:
        _draw_eye(img, eye, u, closure, gaze * u)
    for side, eye in zip((-1.0, 1.0), eyes, strict=True):
        _ellipse(
            img,
            (eye[0] + side * 2 * u, eye[1] - 20 * u),
            (24 * u, 8 * u),
            _BROW,
            max(2, round(4 * u)),
            arc=(200.0, 340.0),
        )
    # Nose: bridge shading, tip, nostrils.
    _ellipse(img, (hx + 6 * u, hy + 18 * u), (5 * u, 30 * u), _SKIN_SHADE, 2, arc=(-80.0, 80.0))
    _blend_ellipse(img, (hx, hy + 44 * u), (17 * u, 9 * u), (95, 125, 180), 0.35)
    for side in (-1.0, 1.0):
        _ellipse(img, (hx + side * 8 * u, hy + 47 * u), (4 * u, 2.4 * u), (60, 75, 120))

    # Closed mouth, centred where the lip-sync stand-in opens its mouth.
    mouth = (hx, hy + 88.0 * u)
    side_px = 210.0 * u  # ≈ jaw width: crop width "from landmark 1 to 31"
    rect = crop_rect_for_mouth(mouth, side_px, size)
    s = rect[2] - rect[0]
    half_w = DEFAULT_MOUTH_HALF_WIDTH * _INPUT_SIZE * s / _CROP_SIZE
    mx, my = mouth
    _ellipse(img, (mx, my - 3.5 * u), (half_w, 6.0 * u), _LIPS, arc=(180.0, 360.0))
    _ellipse(img, (mx, my), (half_w * 0.9, 8.5 * u), _LIPS, arc=(0.0, 180.0))
    _ellipse(img, (mx, my - 2.0 * u), (half_w, 3.0 * u), _LIP_LINE, 2, arc=(10.0, 170.0))
    _blend_ellipse(img, (mx, my + 28 * u), (22 * u, 6 * u), _SKIN_SHADE, 0.3)
    return FaceFrame(img, rect, mouth, eyes, closure)


def draw_face_frames(
    count: int = FRAME_COUNT, size: tuple[int, int] = FRAME_SIZE, seed: int = 0
) -> Iterator[FaceFrame]:
    """Yield ``count`` frames of the procedural person at ``size`` (width, height).

    The head sways (tens of px in x and y, ±3% scale) and blinks every 2-3 s; the mouth
    stays closed, as in a recorded avatar video. Same arguments, same pixels.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    w, h = size
    if w < 320 or h < 320 or w % 2 or h % 2:
        raise ValueError(f"size must be even and at least 320x320, got {w}x{h}")
    rng = np.random.default_rng(seed)
    phases = rng.uniform(0.0, 2.0 * math.pi, size=5)
    closures = _blink_closures(count, rng)
    background = _background(size)
    k = min(w / 1280.0, h / 720.0)
    for i in range(count):
        t = i / FPS
        hx = w * 0.5 + k * (
            22.0 * math.sin(2 * math.pi * t / 4.6 + phases[0])
            + 7.0 * math.sin(2 * math.pi * t / 1.9 + phases[1])
        )
        hy = h * 0.4 + k * 11.0 * math.sin(2 * math.pi * t / 3.3 + phases[2])
        scale = k * (1.0 + 0.03 * math.sin(2 * math.pi * t / 5.7 + phases[3]))
        gaze = 2.5 * math.sin(2 * math.pi * t / 3.9 + phases[4])
        yield _draw_frame(background, hx, hy, scale, float(closures[i]), gaze)


def _manifest(count: int, size: tuple[int, int]) -> dict[str, object]:
    return {
        "format": "lipstream-avatar",
        "version": 1,
        "name": "Demo avatar (procedural stand-in)",
        "description": (
            "A person drawn by OpenCV and untrained stand-in models that open a drawn "
            "mouth with the audio's loudness. For trying lipstream without downloads."
        ),
        "fps": FPS,
        "frame_size": [size[0], size[1]],
        "frames": {"dir": "frames", "pattern": "{index:05d}.jpg", "count": count},
        "rects": "rects.json",
        "models": {"lipsync": "lipsync.onnx", "audio_encoder": "audio_encoder.onnx"},
        "adapter": {
            "name": "unet_328",
            "input_size": _INPUT_SIZE,
            "crop_size": _CROP_SIZE,
            "crop_border": _CROP_BORDER,
            "mask_rect": [5, 5, 310, 305],
            "color_order": "bgr",
            "channel_order": "reference_first",
            "pixel_scale": "zero_one",
            "audio_feature": "ave",
            "audio_shape": [32, 16, 16],
            "audio_window": 16,
            "paste_mode": "feather",
            "feather_px": 6,
        },
    }


def write_demo_avatar(
    dest: Path, *, count: int = FRAME_COUNT, size: tuple[int, int] = FRAME_SIZE, seed: int = 0
) -> Path:
    """Write a complete demo avatar package into ``dest`` (created if needed); return it.

    Holds ``avatar.json``, ``frames/NNNNN.jpg``, ``rects.json``, ``lipsync.onnx``,
    ``audio_encoder.onnx`` and, written last, the ``.complete`` marker.
    """
    frames_dir = dest / "frames"
    frames_dir.mkdir(parents=True, exist_ok=True)
    rects: list[list[int]] = []
    for index, frame in enumerate(draw_face_frames(count, size, seed)):
        path = frames_dir / f"{index:05d}.jpg"
        if not cv2.imwrite(str(path), frame.image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
            raise AvatarError(
                f"could not write demo frame {path}: check disk space and permissions"
            )
        rects.append(list(frame.rect))
    (dest / "rects.json").write_text(json.dumps(rects) + "\n", encoding="utf-8")
    build_lipsync_model(dest / "lipsync.onnx")
    build_audio_encoder(dest / "audio_encoder.onnx")
    manifest = json.dumps(_manifest(count, size), indent=2) + "\n"
    (dest / "avatar.json").write_text(manifest, encoding="utf-8")
    (dest / COMPLETE_MARKER).write_text(DEMO_PACKAGE_VERSION + "\n", encoding="utf-8")
    return dest


def _is_complete(package: Path) -> bool:
    return (package / COMPLETE_MARKER).is_file()


def _remove_stale_temps(parent: Path, prefix: str) -> None:
    now = time.time()
    for entry in parent.glob(prefix + "*"):
        try:
            age = now - entry.stat().st_mtime
        except FileNotFoundError:  # another process removed it meanwhile
            continue
        if age > STALE_TEMP_S:
            logger.warning("removing leftover demo avatar temp dir %s (%.0f s old)", entry, age)
            shutil.rmtree(entry, ignore_errors=True)


def ensure_demo_avatar(data_dir: Path) -> Path:
    """Return ``data_dir/avatars/demo-v1``, generating it first if it is not complete.

    Generation goes into a temp dir next to the target, renamed into place when done,
    so readers never see half a package. When two processes race, the loser's rename
    fails, it drops its copy and returns the winner's.
    """
    parent = data_dir / "avatars"
    target = parent / DEMO_PACKAGE_VERSION
    if _is_complete(target):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{DEMO_PACKAGE_VERSION}.tmp-"
    _remove_stale_temps(parent, prefix)
    logger.info("generating the demo avatar into %s (first use)", target)
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        write_demo_avatar(tmp)
        _move_into_place(tmp, target, prefix)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("demo avatar ready at %s (%.1f s)", target, time.perf_counter() - started)
    return target


def _move_into_place(tmp: Path, target: Path, prefix: str) -> None:
    try:
        os.replace(tmp, target)
        return
    except OSError:
        if _is_complete(target):
            logger.info("another process generated the demo avatar first; using %s", target)
            return
    # The target exists but is not a complete package (made by hand or by an old
    # non-atomic generator): move it aside and retry once.
    aside = Path(tempfile.mkdtemp(prefix=prefix + "broken-", dir=target.parent))
    try:
        os.replace(target, aside)
        os.replace(tmp, target)
    except OSError as exc:
        if not _is_complete(target):
            raise AvatarError(
                f"cannot create the demo avatar at {target}: {exc}; remove that directory"
            ) from exc
    finally:
        shutil.rmtree(aside, ignore_errors=True)
