"""Paste-back of inferred faces into I420 frames: geometry, feathered seam, alpha."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from compositor.paste import Paster, compose_crop, feather_mask
from compositor.yuv import Rect, bgr_to_i420, planes

W, H = 320, 240
RECT: Rect = (100, 60, 266, 226)  # 166 px square, even-aligned


def _uniform_bgr(colour: tuple[int, int, int], w: int, h: int) -> np.ndarray:
    return np.full((h, w, 3), colour, dtype=np.uint8)


def _yuv_of(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    y, u, v = planes(bgr_to_i420(_uniform_bgr(colour, 2, 2)))
    return int(y[0, 0]), int(u[0, 0]), int(v[0, 0])


def _noise_frame(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return bgr_to_i420(rng.integers(0, 256, (H, W, 3), dtype=np.uint8))


def _inside(rect: Rect, shape: tuple[int, int], scale: int = 1) -> np.ndarray:
    x1, y1, x2, y2 = (c // scale for c in rect)
    inside = np.zeros(shape, dtype=bool)
    inside[y1:y2, x1:x2] = True
    return inside


def test_compose_crop_places_prediction_inside_border() -> None:
    reference = _uniform_bgr((10, 20, 30), 328, 328)
    prediction = _uniform_bgr((200, 150, 100), 320, 320)
    crop = compose_crop(reference, prediction, 4)
    assert crop.shape == (328, 328, 3)
    assert (crop[4:324, 4:324] == (200, 150, 100)).all()
    ring = np.ones((328, 328), dtype=bool)
    ring[4:324, 4:324] = False
    assert (crop[ring] == (10, 20, 30)).all()
    assert (reference == (10, 20, 30)).all()  # the reference is not modified


@pytest.mark.parametrize(("c", "s", "border"), [(328, 320, 3), (328, 322, 4), (330, 320, 4)])
def test_compose_crop_rejects_sizes_that_do_not_fit(c: int, s: int, border: int) -> None:
    with pytest.raises(ValueError, match="border"):
        compose_crop(_uniform_bgr((0, 0, 0), c, c), _uniform_bgr((0, 0, 0), s, s), border)


def test_feather_mask_ramps_from_edge_to_one() -> None:
    mask = feather_mask(40, 30, 6)
    assert mask.shape == (30, 40)
    assert mask.dtype == np.float32
    assert mask.min() >= 0.0
    assert mask.max() <= 1.0
    assert (mask[0, :] == 0).all()
    assert (mask[-1, :] == 0).all()
    assert (mask[:, 0] == 0).all()
    assert (mask[:, -1] == 0).all()
    assert (mask[6:-6, 6:-6] == 1).all()
    row = mask[15, :7]
    assert (np.diff(row) > 0).all()  # strictly rising across the band
    assert 0 < mask[15, 3] < 1


def test_feather_mask_zero_is_hard() -> None:
    assert (feather_mask(12, 8, 0) == 1).all()


def test_paste_lands_exactly_in_rect() -> None:
    frame = _noise_frame()
    before = frame.copy()
    colour = (40, 180, 90)
    crop = compose_crop(_uniform_bgr((0, 0, 255), 328, 328), _uniform_bgr(colour, 320, 320), 4)
    feather = 6
    Paster(feather).paste(frame, RECT, crop)

    y, u, v = planes(frame)
    y0, u0, v0 = planes(before)
    outside_y = ~_inside(RECT, y.shape)
    outside_c = ~_inside(RECT, u.shape, scale=2)
    np.testing.assert_array_equal(y[outside_y], y0[outside_y])
    np.testing.assert_array_equal(u[outside_c], u0[outside_c])
    np.testing.assert_array_equal(v[outside_c], v0[outside_c])

    # Beyond the feather band (plus the crop's scaled 4 px reference ring) only the
    # prediction's colour remains.
    margin = feather + 4
    x1, y1, x2, y2 = RECT
    ey, eu, ev = _yuv_of(colour)
    core_y = y[y1 + margin : y2 - margin, x1 + margin : x2 - margin].astype(int)
    core_u = u[(y1 + margin) // 2 : (y2 - margin) // 2, (x1 + margin) // 2 : (x2 - margin) // 2]
    core_v = v[(y1 + margin) // 2 : (y2 - margin) // 2, (x1 + margin) // 2 : (x2 - margin) // 2]
    assert np.abs(core_y - ey).max() <= 1
    assert np.abs(core_u.astype(int) - eu).max() <= 1
    assert np.abs(core_v.astype(int) - ev).max() <= 1
    assert not np.array_equal(y, y0)


def test_full_strength_hard_paste_writes_converted_region_exactly() -> None:
    rng = np.random.default_rng(3)
    frame = _noise_frame(seed=4)
    crop = rng.integers(0, 256, (328, 328, 3), dtype=np.uint8)
    Paster(0).paste(frame, RECT, crop)
    x1, y1, x2, y2 = RECT
    resized = np.asarray(
        cv2.resize(crop, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR), dtype=np.uint8
    )
    ey, eu, ev = planes(bgr_to_i420(resized))
    y, u, v = planes(frame)
    np.testing.assert_array_equal(y[y1:y2, x1:x2], ey)
    np.testing.assert_array_equal(u[y1 // 2 : y2 // 2, x1 // 2 : x2 // 2], eu)
    np.testing.assert_array_equal(v[y1 // 2 : y2 // 2, x1 // 2 : x2 // 2], ev)


def test_seam_is_feathered_on_every_side() -> None:
    background, face = (30, 30, 30), (220, 220, 220)
    frame = bgr_to_i420(_uniform_bgr(background, W, H))
    feather = 8
    Paster(feather).paste(frame, RECT, _uniform_bgr(face, 100, 100))
    y = planes(frame)[0].astype(int)
    bg_y, face_y = _yuv_of(background)[0], _yuv_of(face)[0]
    x1, y1, x2, y2 = RECT
    mid_x, mid_y = (x1 + x2) // 2, (y1 + y2) // 2
    profiles = {
        "left": y[mid_y, x1 : x1 + feather + 1],
        "right": y[mid_y, x2 - feather - 1 : x2][::-1],
        "top": y[y1 : y1 + feather + 1, mid_x],
        "bottom": y[y2 - feather - 1 : y2, mid_x][::-1],
    }
    for side, profile in profiles.items():
        assert abs(profile[0] - bg_y) <= 1, side  # the edge pixel is the original
        assert (np.diff(profile) >= 0).all(), side  # rises monotonically inward
        assert profile[-1] == face_y, side  # full face from feather_px in
        assert bg_y + 20 < profile[feather // 2] < face_y - 20, side  # a real blend
    assert y[mid_y, x1 - 1] == bg_y
    assert y[mid_y, x2] == bg_y


def test_hard_paste_has_a_sharp_edge() -> None:
    background, face = (30, 30, 30), (220, 220, 220)
    frame = bgr_to_i420(_uniform_bgr(background, W, H))
    Paster(0).paste(frame, RECT, _uniform_bgr(face, 328, 328))
    y, u, _ = planes(frame)
    bg_y, face_y = _yuv_of(background)[0], _yuv_of(face)[0]
    x1, y1, x2, y2 = RECT
    mid_y = (y1 + y2) // 2
    assert y[mid_y, x1 - 1] == bg_y
    assert y[mid_y, x1] == face_y
    assert y[mid_y, x2 - 1] == face_y
    assert y[mid_y, x2] == bg_y
    assert y[y1, x1] == face_y  # corners too
    assert u[y1 // 2, x1 // 2] == _yuv_of(face)[1]


def test_alpha_zero_is_identity() -> None:
    frame = _noise_frame(seed=5)
    before = frame.copy()
    Paster(6).paste(frame, RECT, _uniform_bgr((255, 255, 255), 328, 328), alpha=0.0)
    np.testing.assert_array_equal(frame, before)


def test_half_alpha_blends_halfway() -> None:
    background, face = (21, 21, 21), (220, 220, 220)
    frame = bgr_to_i420(_uniform_bgr(background, W, H))
    Paster(4).paste(frame, RECT, _uniform_bgr(face, 328, 328), alpha=0.5)
    y = planes(frame)[0]
    bg_y, face_y = _yuv_of(background)[0], _yuv_of(face)[0]
    assert (bg_y + face_y) % 2 == 1  # so rounding is visible
    centre = int(y[(RECT[1] + RECT[3]) // 2, (RECT[0] + RECT[2]) // 2])
    assert centre == (bg_y + face_y + 1) // 2  # the mean, rounded half up


@pytest.mark.parametrize(
    ("rect", "message"),
    [
        ((101, 60, 267, 226), "even"),
        ((100, 60, 266, 227), "even"),
        ((200, 60, 322, 226), "outside"),
        ((100, 60, 100, 226), "outside"),
    ],
)
def test_paste_rejects_bad_rects(rect: Rect, message: str) -> None:
    frame = _noise_frame()
    with pytest.raises(ValueError, match=message):
        Paster(4).paste(frame, rect, _uniform_bgr((0, 0, 0), 328, 328))


def test_paste_rejects_read_only_frame_and_bad_alpha() -> None:
    frame = _noise_frame()
    crop = _uniform_bgr((0, 0, 0), 328, 328)
    with pytest.raises(ValueError, match="alpha"):
        Paster(4).paste(frame, RECT, crop, alpha=1.5)
    with pytest.raises(ValueError, match="alpha"):
        Paster(4).paste(frame, RECT, crop, alpha=float("nan"))
    frame.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        Paster(4).paste(frame, RECT, crop)


def test_mask_cache_is_bounded() -> None:
    paster = Paster(4, max_masks=2)
    frame = _noise_frame()
    crop = _uniform_bgr((90, 90, 90), 328, 328)
    for size in (40, 60, 80, 60):
        paster.paste(frame, (0, 0, size, size), crop)
        assert paster.cached_masks <= 2
    assert paster.cached_masks == 2
