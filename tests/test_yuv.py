"""I420 frame helpers: layout, conversions, region crops, rect snapping."""

from __future__ import annotations

import av
import numpy as np
import pytest

from compositor.yuv import bgr_to_i420, crop_bgr, even_rect, frame_size, i420_to_bgr, planes


def _blocky_bgr(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Random colours constant over 2×2 blocks, so 4:2:0 subsampling loses nothing."""
    rng = np.random.default_rng(seed)
    small = rng.integers(16, 240, (h // 2, w // 2, 3), dtype=np.uint8)
    return np.repeat(np.repeat(small, 2, axis=0), 2, axis=1)


def test_bgr_to_i420_layout_and_round_trip() -> None:
    bgr = _blocky_bgr(64, 48)
    frame = bgr_to_i420(bgr)
    assert frame.shape == (72, 64)
    assert frame.dtype == np.uint8
    assert frame.flags.c_contiguous
    assert frame_size(frame) == (64, 48)
    back = i420_to_bgr(frame)
    assert back.shape == bgr.shape
    assert np.abs(back.astype(int) - bgr.astype(int)).max() <= 3


def test_i420_layout_is_what_pyav_takes() -> None:
    frame = bgr_to_i420(_blocky_bgr(64, 48, seed=1))
    video = av.VideoFrame.from_ndarray(frame, format="yuv420p")
    assert (video.width, video.height) == (64, 48)
    np.testing.assert_array_equal(video.to_ndarray(), frame)


def test_planes_have_i420_order() -> None:
    # Pure blue: U (Cb) well above 128, V (Cr) below; swapping the planes would flip that.
    bgr = np.zeros((8, 16, 3), dtype=np.uint8)
    bgr[...] = (255, 0, 0)
    y, u, v = planes(bgr_to_i420(bgr))
    assert y.shape == (8, 16)
    assert u.shape == v.shape == (4, 8)
    assert int(u.min()) > 200
    assert int(v.max()) < 128


def test_plane_views_write_through() -> None:
    frame = np.zeros((12, 8), dtype=np.uint8)  # 8×8 frame
    y, u, v = planes(frame)
    y[1, 2] = 11
    u[0, 1] = 22
    v[3, 3] = 33
    flat = frame.reshape(-1)
    assert flat[1 * 8 + 2] == 11
    assert flat[64 + 0 * 4 + 1] == 22
    assert flat[64 + 16 + 3 * 4 + 3] == 33
    assert int(frame.sum()) == 66


@pytest.mark.parametrize("shape", [(10, 8), (12, 7), (9, 0), (0, 8)])
def test_frame_size_rejects_bad_layouts(shape: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="I420"):
        frame_size(np.zeros(shape, dtype=np.uint8))


def test_bgr_to_i420_rejects_odd_size() -> None:
    with pytest.raises(ValueError, match="even"):
        bgr_to_i420(np.zeros((9, 8, 3), dtype=np.uint8))


def test_crop_bgr_matches_full_conversion() -> None:
    rng = np.random.default_rng(2)
    frame = bgr_to_i420(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8))
    full = i420_to_bgr(frame)
    for rect in [(10, 20, 74, 84), (0, 0, 160, 120), (150, 110, 160, 120), (2, 4, 4, 6)]:
        x1, y1, x2, y2 = rect
        crop = crop_bgr(frame, rect)
        assert crop.shape == (y2 - y1, x2 - x1, 3)
        diff = np.abs(crop.astype(int) - full[y1:y2, x1:x2].astype(int))
        assert diff.max() <= 2, rect


@pytest.mark.parametrize("rect", [(11, 20, 75, 84), (10, 21, 74, 84), (10, 20, 73, 84)])
def test_crop_bgr_rejects_odd_rect(rect: tuple[int, int, int, int]) -> None:
    frame = bgr_to_i420(np.zeros((120, 160, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="even"):
        crop_bgr(frame, rect)


@pytest.mark.parametrize("rect", [(0, 0, 162, 120), (-2, 0, 10, 10), (20, 20, 20, 40)])
def test_crop_bgr_rejects_rect_outside_frame(rect: tuple[int, int, int, int]) -> None:
    frame = bgr_to_i420(np.zeros((120, 160, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="outside"):
        crop_bgr(frame, rect)


@pytest.mark.parametrize(
    ("rect", "expected"),
    [
        ((11, 21, 75, 85), (10, 20, 76, 86)),
        ((10, 20, 74, 84), (10, 20, 74, 84)),
        ((-3, -1, 5, 7), (0, 0, 6, 8)),
        ((150, 110, 171, 131), (150, 110, 160, 120)),
    ],
)
def test_even_rect_snaps_outward_inside_frame(
    rect: tuple[int, int, int, int], expected: tuple[int, int, int, int]
) -> None:
    snapped = even_rect(rect, 160, 120)
    assert snapped == expected
    assert all(c % 2 == 0 for c in snapped)


def test_even_rect_rejects_rect_outside_frame() -> None:
    with pytest.raises(ValueError, match="overlap"):
        even_rect((200, 10, 220, 30), 160, 120)
