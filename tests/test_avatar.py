"""Avatar packages: id rules, loading, and `validate` listing every problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest

from inference_core.avatars.exceptions import (
    AvatarInvalidError,
    AvatarNotFoundError,
    InvalidAvatarIdError,
)
from inference_core.avatars.locator import AvatarLocator
from inference_core.avatars.package import AvatarPackage, check_avatar_id
from inference_core.avatars.validation import validate_package
from tests.onnx_builders import tiny_lipsync
from tests.packages import COUNT, make_package


def _edit_manifest(directory: Path, **changes: object) -> None:
    path = directory / "avatar.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_valid_package_loads_and_validates(tmp_path: Path) -> None:
    pkg_dir = make_package(tmp_path / "alice")
    assert validate_package(pkg_dir) == []
    package = AvatarPackage.load(pkg_dir)
    assert package.avatar_id == "alice"
    assert package.frame_count == COUNT
    assert package.rects.shape == (COUNT, 4)
    assert (package.rects % 2 == 0).all()  # snapped even for 4:2:0 chroma
    assert package.manifest.adapter.name == "unet_328"  # default adapter


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    pkg_dir = make_package(tmp_path / "broken")
    (pkg_dir / "frames" / "00002.jpg").unlink()
    (pkg_dir / "frames" / "00004.jpg").unlink()
    rects = json.loads((pkg_dir / "rects.json").read_text())
    rects[1] = [100, 30, 200, 130]  # past the right edge of a 160-wide frame
    (pkg_dir / "rects.json").write_text(json.dumps(rects))
    problems = validate_package(pkg_dir)
    text = "\n".join(problems)
    assert "2 of 6 frame files missing (00002.jpg, 00004.jpg)" in text
    assert "out of bounds" in text
    assert "frame 1" in text


def test_validate_reports_model_and_frame_problems(tmp_path: Path) -> None:
    pkg_dir = make_package(tmp_path / "models")
    tiny_lipsync(pkg_dir / "lipsync.onnx", size=160)  # does not fit unet_328
    (pkg_dir / "audio_encoder.onnx").write_bytes(b"not an onnx file" * 10)
    cv2.imwrite(str(pkg_dir / "frames" / "00003.jpg"), np.zeros((60, 80, 3), np.uint8))
    problems = "\n".join(validate_package(pkg_dir))
    assert "models.lipsync" in problems
    assert "need a visual input [B,6,320,320]" in problems
    assert "models.audio_encoder" in problems
    assert "not a readable ONNX model" in problems
    assert "00003.jpg is 80x60" in problems


def test_validate_refuses_external_data_outside_package(tmp_path: Path) -> None:
    pkg_dir = make_package(tmp_path / "ext")
    model = onnx.load(str(pkg_dir / "lipsync.onnx"))
    secret = tmp_path / "outside.bin"
    secret.write_bytes(b"\0" * 1024)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "../outside.bin"), ("offset", "0"), ("length", "72")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(pkg_dir / "lipsync.onnx"))
    problems = "\n".join(validate_package(pkg_dir))
    assert "outside the avatar package" in problems


def test_bad_manifest_values_are_named(tmp_path: Path) -> None:
    pkg_dir = make_package(tmp_path / "manifest")
    _edit_manifest(pkg_dir, fps=0, frame_size=[161, 120], adapter={"color_order": "yuv"})
    problems = "\n".join(validate_package(pkg_dir))
    assert "avatar.json: fps:" in problems
    assert "adapter.color_order" in problems
    assert '"yuv"' in problems
    assert "frame_size" in problems
    (pkg_dir / "avatar.json").write_text("{not json")
    assert "invalid JSON at line 1" in validate_package(pkg_dir)[0]
    with pytest.raises(AvatarInvalidError, match="invalid JSON") as info:
        AvatarPackage.load(pkg_dir)
    assert info.value.problems


@pytest.mark.parametrize(
    "bad", ["", "Alice", "../etc", "a/b", "/abs", "a" * 65, "dots.dots", "démo", "a b"]
)
def test_malformed_ids_are_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidAvatarIdError, match="invalid avatar id"):
        check_avatar_id(bad)
    with pytest.raises(InvalidAvatarIdError):
        AvatarLocator(tmp_path).locate(bad)


def test_locator_resolves_inside_root_only(tmp_path: Path) -> None:
    root = tmp_path / "avatars"
    make_package(root / "alice")
    outside = make_package(tmp_path / "elsewhere")
    os.symlink(outside, root / "escape")
    locator = AvatarLocator(root)
    assert locator.locate("alice") == root / "alice"
    assert locator.list_ids() == ["alice"]
    with pytest.raises(InvalidAvatarIdError, match="outside the avatar root"):
        locator.locate("escape")
    with pytest.raises(AvatarNotFoundError, match=r"no avatar 'bob'.*available: alice"):
        locator.locate("bob")
