"""Small avatar packages built in tests."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from tests.onnx_builders import tiny_encoder, tiny_lipsync

W, H, COUNT = 160, 120, 6


def make_package(directory: Path, *, count: int = COUNT) -> Path:
    """A small but complete, valid avatar package."""
    (directory / "frames").mkdir(parents=True)
    rects = []
    for i in range(count):
        frame = np.full((H, W, 3), 40 + 10 * i, dtype=np.uint8)
        cv2.imwrite(str(directory / "frames" / f"{i:05d}.jpg"), frame)
        rects.append([40 + i, 30, 104 + i, 94])
    (directory / "rects.json").write_text(json.dumps(rects))
    tiny_lipsync(directory / "lipsync.onnx")
    tiny_encoder(directory / "audio_encoder.onnx")
    manifest = {
        "format": "lipstream-avatar",
        "version": 1,
        "name": "test",
        "fps": 25,
        "frame_size": [W, H],
        "frames": {"dir": "frames", "pattern": "{index:05d}.jpg", "count": count},
        "rects": "rects.json",
        "models": {"lipsync": "lipsync.onnx", "audio_encoder": "audio_encoder.onnx"},
    }
    (directory / "avatar.json").write_text(json.dumps(manifest))
    return directory
