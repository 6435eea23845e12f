"""A model's tensor contracts over the inference protocols, and the door every protocol takes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from config.settings import Settings
from inference_core.adapter.onnx_io import ModelBinding
from inference_core.adapter.serving_graph import read_binding
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.locator import AvatarLocator
from inference_core.exceptions import ModelLoadError
from inference_core.serving.core import InferenceCore, ModelIo
from tests.onnx_builders import tiny_lipsync
from tests.packages import make_package
from web.errors import RequestError
from web.inference.contract import (
    DeclaredTensor,
    contract,
    frames,
    parse_version,
    version_for,
)
from web.inference.door import InferenceDoor

IO = ModelIo(AdapterSpec(), ModelBinding("image", "mel", "face", dynamic_batch=True))
FLOAT = contract("alice", IO, "float", max_frames=8)
UINT8 = contract("alice", IO, "uint8", max_frames=8)


def _declared(n: int, *, visual: str = "FP32", shape: tuple[int, ...] | None = None) -> list:
    return [
        DeclaredTensor("image", visual, shape or (n, 6, 320, 320)),
        DeclaredTensor("mel", "FP32", (n, 32, 16, 16)),
    ]


def test_the_two_versions_carry_the_models_own_names() -> None:
    assert FLOAT.visual.shape == [-1, 6, 320, 320]
    assert FLOAT.output.describe() == "face FP32 [-1,3,320,320]"
    assert UINT8.visual.describe() == "image UINT8 [-1,320,320,3]"
    assert UINT8.output.describe() == "face UINT8 [-1,320,320,3]"
    assert UINT8.audio == FLOAT.audio
    assert FLOAT.frame_bytes == 6 * 320 * 320 * 4 + 32 * 16 * 16 * 4
    assert UINT8.frame_bytes == 320 * 320 * 3 + 32 * 16 * 16 * 4


def test_a_request_without_a_version_is_served_by_its_visual_datatype() -> None:
    uint8 = [DeclaredTensor("image", "UINT8", (1, 320, 320, 3))]
    assert version_for(None, IO, uint8) == "uint8"
    assert version_for(None, IO, _declared(1)) == "float"
    assert version_for("float", IO, uint8) == "float"  # named: then checked as named
    assert parse_version("alice", "") is None
    assert parse_version("alice", "uint8") == "uint8"
    with pytest.raises(RequestError) as error:
        parse_version("alice", "3")
    assert error.value.status == 404
    assert "float, uint8" in str(error.value)


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ([DeclaredTensor("image", "FP32", (1, 6, 320, 320))], "takes the inputs image FP32"),
        (_declared(1, visual="UINT8"), "(UINT8 regions are version uint8)"),
        (_declared(1, visual="FP64"), "must be FP32, got FP64"),
        (_declared(1, visual="COMPLEX"), "datatypes are BOOL"),
        (_declared(1, shape=(1, 3, 320, 320)), "must have shape [-1,6,320,320], got [1, 3,"),
        (_declared(1, shape=(1, 6, 320)), "must have shape"),
        (_declared(9), "1 to 8 frames"),
        (_declared(0), "1 to 8 frames"),
        (
            [DeclaredTensor("image", "FP32", (2, 6, 320, 320)), *_declared(3)[1:]],
            "batch sizes differ (2, 3)",
        ),
    ],
)
def test_declared_tensors_are_refused_before_any_data_is_read(
    declared: list[DeclaredTensor], words: str
) -> None:
    with pytest.raises(RequestError) as error:
        FLOAT.check(declared)
    assert error.value.status == 400
    assert words in str(error.value)


def test_absurd_shapes_cost_nothing() -> None:
    # A shape whose product would be petabytes is refused by comparing dimensions.
    huge = _declared(1, shape=(1, 6, 320, 2**40))
    with pytest.raises(RequestError, match="must have shape"):
        FLOAT.check(huge)
    with pytest.raises(RequestError, match="1 to 8 frames"):
        FLOAT.check(_declared(2**62))


def test_frames_view_the_request_bytes_without_copying() -> None:
    n = FLOAT.check(_declared(2))
    visual = np.random.default_rng(0).random((2, 6, 320, 320), dtype=np.float32)
    audio = np.ones((2, 32, 16, 16), dtype=np.float32)
    body = bytearray(visual.tobytes() + audio.tobytes())
    split = visual.nbytes
    view = memoryview(body)
    got_visual, got_audio = frames(FLOAT, n, {"image": view[:split], "mel": view[split:]})
    np.testing.assert_array_equal(got_visual, visual)
    np.testing.assert_array_equal(got_audio, audio)
    assert np.shares_memory(got_visual, np.frombuffer(body, np.uint8))


def test_frames_refuse_wrong_sizes_and_non_finite_values() -> None:
    audio = np.zeros((1, 32, 16, 16), dtype=np.float32)
    short = {"image": bytes(320 * 320 * 3 - 1), "mel": audio.tobytes()}
    with pytest.raises(RequestError) as error:
        frames(UINT8, 1, short)
    assert error.value.code == "bad_input_size"
    assert "must be 307200 bytes for 1 frame(s)" in str(error.value)
    audio[0, 3, 2, 1] = np.nan
    with pytest.raises(RequestError) as error:
        frames(UINT8, 1, {"image": bytes(320 * 320 * 3), "mel": audio.tobytes()})
    assert error.value.code == "bad_values"


def test_read_binding_names_a_models_own_tensors_and_its_bad_files(tmp_path: Path) -> None:
    model = tiny_lipsync(tmp_path / "m.onnx", visual_name="pixels", audio_name="speech")
    binding = read_binding(model, AdapterSpec())
    assert (binding.visual_name, binding.audio_name, binding.output_name) == (
        "pixels",
        "speech",
        "output",
    )
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"broken\.onnx"):
        read_binding(broken, AdapterSpec())
    with pytest.raises(ModelLoadError, match="cannot be read"):
        read_binding(tmp_path / "missing.onnx", AdapterSpec())


def _settings(root: Path, *, load_on_infer: bool = True) -> Settings:
    return Settings.model_validate(
        {
            "avatars": {"root": str(root), "data_dir": str(root / "data"), "demo": False},
            "devices": {"kind": "cpu", "count": 1},
            "registry": {"load_on_infer": load_on_infer},
        }
    )


@pytest.fixture
async def door_without_loads(tmp_path: Path) -> AsyncIterator[InferenceDoor]:
    root = tmp_path / "avatars"
    package = make_package(root / "alice")
    tiny_lipsync(package / "lipsync.onnx", visual_name="pixels", audio_name="speech")
    settings = _settings(root, load_on_infer=False)
    core = InferenceCore(settings, AvatarLocator(root))
    await core.start()
    try:
        yield InferenceDoor(core, settings)
    finally:
        await core.stop()


async def test_metadata_does_not_load_and_requests_wait_for_a_load(
    door_without_loads: InferenceDoor,
) -> None:
    door = door_without_loads
    spec = await door.contract("alice", "uint8")
    assert spec.visual.name == "pixels"  # read from the file: the model is not loaded
    assert not door.is_ready("alice")
    assert not door.core.is_loaded("alice")
    with pytest.raises(RequestError) as error:
        await door.infer_contract("alice", "uint8")
    assert error.value.status == 503
    assert error.value.code == "model_not_ready"
    await door.load("alice")
    assert door.is_ready("alice")
    chosen, n = await door.request_contract(
        "alice",
        None,
        [
            DeclaredTensor("pixels", "UINT8", (3, 320, 320, 3)),
            DeclaredTensor("speech", "FP32", (3, 32, 16, 16)),
        ],
    )
    assert (chosen.version, n) == ("uint8", 3)
    regions = np.zeros((3, 320, 320, 3), dtype=np.uint8)
    result = await door.infer(chosen, regions, np.zeros((3, 32, 16, 16), dtype=np.float32))
    assert result.outputs.shape == (3, 320, 320, 3)
    assert result.outputs.dtype == np.uint8
    assert result.device == "cpu:0"
    (stats,) = await door.statistics("alice")
    assert stats.requests.success_count == 1
    assert stats.requests.fail_count == 0
    assert stats.frames == 3  # the warm-up runs no frames through the counters
    assert stats.batches == 2  # at most 2 frames a run on a CPU device (batching's default)
    assert stats.inference_ns > 0


async def test_unknown_and_malformed_models(door_without_loads: InferenceDoor) -> None:
    door = door_without_loads
    assert not door.is_registered("bob")
    assert not door.is_ready("bob")
    assert not door.is_registered("../etc")
    with pytest.raises(Exception, match="bob"):
        await door.contract("bob", "float")
