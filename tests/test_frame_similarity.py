"""Frame thumbnails: what "nearest frame" and "the avatar's own motion" mean."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from compositor.background_cache import AvatarFrames, BackgroundCache
from compositor.frame_similarity import FrameThumbnails, thumbnail
from compositor.yuv import bgr_to_i420


def _bgr(level: int, w: int = 96, h: int = 64) -> np.ndarray:
    image = np.full((h, w, 3), level, dtype=np.uint8)
    image[: h // 2, : w // 2] = 255 - level  # some structure, not a flat field
    return image


def test_an_i420_frame_and_its_bgr_give_the_same_picture() -> None:
    image = _bgr(90)
    from_yuv = thumbnail(bgr_to_i420(image))
    from_bgr = thumbnail(image)
    assert from_yuv.shape == (32, 32)
    assert from_yuv.dtype == np.float32
    # I420 luma is studio range (16-235), OpenCV's grey full range: the same picture.
    assert np.abs(from_yuv - (16 + from_bgr * 219 / 255)).max() <= 1.0


def test_a_frame_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="I420"):
        thumbnail(np.zeros((65, 64), dtype=np.uint8))


def test_distance_is_the_mean_grey_difference() -> None:
    frames = [np.full((48, 32), level, dtype=np.uint8) for level in (10, 30, 25, 200)]
    thumbs = FrameThumbnails.build(len(frames), frames.__getitem__)
    assert len(thumbs) == 4
    assert thumbs.distance(0, 0) == 0.0
    assert thumbs.distance(0, 1) == pytest.approx(20.0)
    assert thumbs.distance(1, 0) == thumbs.distance(0, 1)
    assert thumbs.max_step() == pytest.approx(175.0)  # 25 -> 200
    assert thumbs.max_step(0, 3) == pytest.approx(20.0)
    assert thumbs.max_step(2, 3) == 0.0  # one frame: no step


def test_thumbnails_from_an_avatars_cached_frames(tmp_path: Path) -> None:
    paths = []
    for i, level in enumerate((40, 60, 80)):
        path = tmp_path / f"{i:05d}.png"
        cv2.imwrite(str(path), _bgr(level))
        paths.append(path)
    frames = AvatarFrames("a", paths, BackgroundCache(10**7))
    thumbs = FrameThumbnails.build(len(frames), frames.get)
    near = thumbs.distance(0, 1)
    assert near > 0
    assert thumbs.distance(0, 2) > near
    assert thumbs.max_step() == pytest.approx(max(near, thumbs.distance(1, 2)))


def test_thumbnails_are_read_only_and_need_a_frame() -> None:
    thumbs = FrameThumbnails(np.zeros((2, 4, 4), dtype=np.float32))
    assert thumbs.max_step() == 0.0
    with pytest.raises(ValueError, match="N >= 1"):
        FrameThumbnails(np.zeros((0, 4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="count"):
        FrameThumbnails.build(0, lambda i: np.zeros((6, 4), dtype=np.uint8))
