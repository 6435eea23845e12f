"""The built-in demo avatar: drawing, package contents, determinism, atomic first-use generation."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from inference_core.assets.demo_avatar import (
    COMPLETE_MARKER,
    DEMO_PACKAGE_VERSION,
    FaceFrame,
    draw_face_frames,
    ensure_demo_avatar,
    write_demo_avatar,
)
from inference_core.assets.demo_models import DEFAULT_MOUTH_CENTER, loudness_basis
from inference_core.avatars.validation import validate_package

COUNT = 30  # long enough for the first blink (it starts at frame 12-23)
PACKAGE_FILES = ("avatar.json", "rects.json", "lipsync.onnx", "audio_encoder.onnx")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_avatar(tmp_path_factory.mktemp("demo") / "pkg", count=COUNT)


@pytest.fixture(scope="module")
def drawn() -> list[FaceFrame]:
    return list(draw_face_frames(COUNT))


def _all_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _model_crop(image: np.ndarray, rect: tuple[int, int, int, int]) -> np.ndarray:
    x1, y1, x2, y2 = rect
    crop = cv2.resize(image[y1:y2, x1:x2], (328, 328), interpolation=cv2.INTER_CUBIC)
    return crop[4:324, 4:324]


def test_package_has_every_file_and_validates(package: Path) -> None:
    for name in PACKAGE_FILES:
        assert (package / name).is_file(), name
    assert (package / COMPLETE_MARKER).is_file()
    frames = sorted((package / "frames").iterdir())
    assert [p.name for p in frames] == [f"{i:05d}.jpg" for i in range(COUNT)]
    image = cv2.imread(str(frames[0]))
    assert image is not None
    assert image.shape == (720, 1280, 3)
    manifest = json.loads((package / "avatar.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "lipstream-avatar"
    assert manifest["frames"] == {"dir": "frames", "pattern": "{index:05d}.jpg", "count": COUNT}
    assert manifest["adapter"]["name"] == "unet_328"
    assert manifest["adapter"]["mask_rect"] == [5, 5, 310, 305]
    assert validate_package(package) == []


def test_rects_are_square_even_inside_and_moving(package: Path) -> None:
    rects = np.array(json.loads((package / "rects.json").read_text(encoding="utf-8")))
    assert rects.shape == (COUNT, 4)
    sides = rects[:, 2] - rects[:, 0]
    assert np.array_equal(sides, rects[:, 3] - rects[:, 1])
    assert (rects % 2 == 0).all()
    assert (rects[:, :2] >= 0).all()
    assert (rects[:, 2] <= 1280).all()
    assert (rects[:, 3] <= 720).all()
    assert (sides >= 150).all()
    assert len({tuple(r) for r in rects.tolist()}) > COUNT // 3
    assert np.ptp(rects[:, 0]) >= 4 or np.ptp(rects[:, 1]) >= 4


def test_drawn_mouth_sits_where_the_model_opens_one(drawn: list[FaceFrame]) -> None:
    want = (DEFAULT_MOUTH_CENTER[0] * 320, DEFAULT_MOUTH_CENTER[1] * 320)
    for frame in drawn:
        x1, y1, x2, _ = frame.rect
        scale = 328 / (x2 - x1)
        mx = (frame.mouth[0] - x1) * scale - 4
        my = (frame.mouth[1] - y1) * scale - 4
        assert abs(mx - want[0]) <= 2.0, (mx, my)
        assert abs(my - want[1]) <= 2.0, (mx, my)
    # In pixels: the crop shows lips (reddish) at the model's mouth centre, skin above it.
    crop = _model_crop(drawn[0].image, drawn[0].rect).astype(np.int32)
    cx, cy = round(want[0]), round(want[1])
    lips = crop[cy - 3 : cy + 4, cx - 10 : cx + 11]
    skin = crop[cy - 40 : cy - 30, cx - 10 : cx + 11]
    assert np.abs(lips.mean(axis=(0, 1)) - skin.mean(axis=(0, 1))).max() > 30


def test_blinks_close_the_eyes(package: Path, drawn: list[FaceFrame]) -> None:
    closures = [f.eye_closure for f in drawn]
    assert 1.0 in closures
    assert 0.0 in closures

    def eye_white_pixels(index: int) -> int:
        image = cv2.imread(str(package / "frames" / f"{index:05d}.jpg"))
        assert image is not None
        total = 0
        for ex, ey in drawn[index].eyes:
            x, y = round(ex), round(ey)
            patch = image[y - 14 : y + 15, x - 24 : x + 25]
            total += int((patch.min(axis=2) > 215).sum())
        return total

    open_frames = [i for i, c in enumerate(closures) if c == 0.0]
    closed_frames = [i for i, c in enumerate(closures) if c == 1.0]
    assert min(eye_white_pixels(i) for i in open_frames[:5]) > 100
    assert max(eye_white_pixels(i) for i in closed_frames) < 10


def test_demo_models_open_the_drawn_mouth(package: Path, drawn: list[FaceFrame]) -> None:
    """End to end: loud audio through the package's models changes the drawn mouth only."""
    encoder = ort.InferenceSession(
        str(package / "audio_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    lipsync = ort.InferenceSession(
        str(package / "lipsync.onnx"), providers=["CPUExecutionProvider"]
    )
    crop = _model_crop(drawn[5].image, drawn[5].rect)
    ref = crop.transpose(2, 0, 1).astype(np.float32) / 255.0
    masked = ref.copy()
    masked[:, 5:310, 5:315] = 0.0
    visual = np.concatenate([ref, masked])[None]
    mel = np.full((1, 1, 80, 16), 8 * 0.4 - 4, dtype=np.float32)
    embedding = encoder.run(None, {"mel": mel})[0][0]
    np.testing.assert_allclose(embedding @ loudness_basis().T, 0.4, atol=1e-5)
    audio = np.tile(embedding, 16).reshape(1, 32, 16, 16)
    [out] = lipsync.run(None, {"input": visual, "audio": audio})
    changed = np.abs(out[0] - ref).max(axis=0) > 0.1
    ys, xs = np.nonzero(changed)
    assert len(ys) > 2000
    assert abs(ys.mean() - DEFAULT_MOUTH_CENTER[1] * 320) < 6
    assert abs(xs.mean() - DEFAULT_MOUTH_CENTER[0] * 320) < 6


def test_generation_is_byte_deterministic(tmp_path: Path) -> None:
    first = _all_files(write_demo_avatar(tmp_path / "a", count=4))
    second = _all_files(write_demo_avatar(tmp_path / "b", count=4))
    assert len(first) == 4 + len(PACKAGE_FILES) + 1
    assert first == second


def test_draw_rejects_odd_size() -> None:
    with pytest.raises(ValueError, match="even"):
        next(draw_face_frames(1, size=(641, 480)))


def test_ensure_generates_once_and_reuses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    avatars = tmp_path / "avatars"
    avatars.mkdir()
    # A crashed generator's leftovers: one stale (removed), one recent (maybe live, kept).
    stale = avatars / f".{DEMO_PACKAGE_VERSION}.tmp-crashed"
    (stale / "frames").mkdir(parents=True)
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    recent = avatars / f".{DEMO_PACKAGE_VERSION}.tmp-running"
    recent.mkdir()
    # A half-written target without the completion marker must not be trusted.
    target = avatars / DEMO_PACKAGE_VERSION
    target.mkdir()
    (target / "avatar.json").write_text("{", encoding="utf-8")

    with caplog.at_level(logging.INFO, logger="inference_core.assets.demo_avatar"):
        path = ensure_demo_avatar(tmp_path)
    assert path == target
    assert validate_package(path) == []
    assert not stale.exists()
    assert recent.exists()
    assert any("generating" in r.getMessage() for r in caplog.records)

    marker_mtime = (path / COMPLETE_MARKER).stat().st_mtime_ns
    manifest_mtime = (path / "avatar.json").stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="inference_core.assets.demo_avatar"):
        assert ensure_demo_avatar(tmp_path) == path
    assert not any("generating" in r.getMessage() for r in caplog.records)
    assert (path / COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime
    assert (path / "avatar.json").stat().st_mtime_ns == manifest_mtime
    assert sorted(p.name for p in avatars.iterdir()) == sorted([recent.name, target.name])


def test_ensure_racing_processes_agree(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(ensure_demo_avatar(tmp_path))
        except BaseException as exc:  # collected and re-raised by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [tmp_path / "avatars" / DEMO_PACKAGE_VERSION] * 3
    assert validate_package(results[0]) == []
    assert [p.name for p in (tmp_path / "avatars").iterdir()] == [DEMO_PACKAGE_VERSION]
