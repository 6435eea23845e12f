"""What the Open Inference Protocol tests send and expect: an avatar whose model names
its own tensors, frames for either contract, tritonclient inputs, the model's own answer.

Shared by ``tests/test_oip_rest.py`` and ``tests/test_oip_rest_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.http as triton

from inference_core.adapter.lipsync import LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from tests.onnx_builders import tiny_lipsync
from tests.packages import make_package

# Not what the builder or any exporter calls them: names must come from the model itself.
VISUAL, AUDIO, OUTPUT = "face_crops", "whisper_feats", "output"
S, AUDIO_SHAPE = 320, (32, 16, 16)
TOKEN = "oip-admin-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
#: tritonclient.http.aio posts its request to aiohttp as bytes, and aiohttp warns
#: (ResourceWarning) that a body over 1 MiB given as bytes could block the event loop: the
#: client's choice, not the server's fault. The tests that use it ignore that one warning.
LARGE_BODY_WARNING = "ignore:Sending a large body directly with raw bytes:ResourceWarning"


def avatar(root: Path, name: str = "alice") -> Path:
    """A test avatar whose ONNX model has its own tensor names (audio declared first);
    the model's path."""
    directory = make_package(root / name)
    tiny_lipsync(directory / "lipsync.onnx", visual_name=VISUAL, audio_name=AUDIO, audio_first=True)
    return directory / "lipsync.onnx"


def frames(n: int, *, uint8: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` visual inputs of the contract (uint8 BGR regions or float model inputs) and
    ``n`` audio windows."""
    rng = np.random.default_rng(seed)
    visual: np.ndarray = (
        rng.integers(0, 256, (n, S, S, 3), dtype=np.uint8)
        if uint8
        else rng.random((n, 6, S, S), dtype=np.float32)
    )
    return visual, rng.normal(0, 1, (n, *AUDIO_SHAPE)).astype(np.float32)


def triton_inputs(visual: np.ndarray, audio: np.ndarray, *, binary: bool = True) -> list[Any]:
    """tritonclient's inputs (its sync and aio clients share the class): bytes by default,
    JSON ``data`` with ``binary=False``."""
    datatype = "UINT8" if visual.dtype == np.uint8 else "FP32"
    tensors = [
        triton.InferInput(VISUAL, list(visual.shape), datatype),
        triton.InferInput(AUDIO, list(audio.shape), "FP32"),
    ]
    tensors[0].set_data_from_numpy(visual, binary_data=binary)
    tensors[1].set_data_from_numpy(audio, binary_data=binary)
    return tensors


def expected(model: Path, visual: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """What the model itself gives: a plain onnxruntime session (float), the serving graph
    the live path runs (uint8)."""
    if visual.dtype == np.uint8:
        return LipSyncAdapter.from_path(model, AdapterSpec()).run(visual, audio)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run([OUTPUT], {VISUAL: visual, AUDIO: audio})[0])


def assert_output(model: Path, visual: np.ndarray, audio: np.ndarray, got: np.ndarray) -> None:
    """``got`` is the model's answer: bit-exact for uint8 (as on the live path), within
    1e-5 for float."""
    want = expected(model, visual, audio)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if visual.dtype == np.uint8:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=1e-5)
