"""The lip-sync adapter: binding by shape, input building, batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference_core.adapter.lipsync import FaceInputBuilder, LipSyncAdapter
from inference_core.adapter.spec import AdapterSpec
from inference_core.exceptions import ModelInputError, ModelLoadError
from tests.onnx_builders import WAV2LIP_96, tiny_lipsync

SPEC = AdapterSpec()


def _inputs(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 BGR model regions and audio windows."""
    rng = np.random.default_rng(seed)
    regions = rng.integers(0, 256, (n, 320, 320, 3), dtype=np.uint8)
    audio = rng.normal(0, 1, (n, 32, 16, 16)).astype(np.float32)
    return regions, audio


def test_exports_differing_only_in_input_names_give_identical_results(tmp_path: Path) -> None:
    a = tiny_lipsync(tmp_path / "a.onnx", visual_name="input", audio_name="audio")
    b = tiny_lipsync(
        tmp_path / "b.onnx",
        visual_name="visual_frames",
        audio_name="audio_features",
        audio_first=True,  # declared in the other order too
    )
    visual, audio = _inputs(3)
    out_a = LipSyncAdapter.from_path(a, SPEC).run(visual, audio)
    out_b = LipSyncAdapter.from_path(b, SPEC).run(visual, audio)
    assert out_a.shape == (3, 320, 320, 3)
    assert out_a.dtype == np.uint8
    np.testing.assert_array_equal(out_a, out_b)
    assert LipSyncAdapter.from_path(b, SPEC).binding.visual_name == "visual_frames"


def test_batch_equals_one_by_one_with_chunking(tmp_path: Path) -> None:
    adapter = LipSyncAdapter.from_path(tiny_lipsync(tmp_path / "m.onnx"), SPEC, max_batch_size=2)
    visual, audio = _inputs(5)
    batched = adapter.run(visual, audio)
    single = np.concatenate([adapter.run(visual[i : i + 1], audio[i : i + 1]) for i in range(5)])
    np.testing.assert_array_equal(batched, single)
    # samples really differ, so a mix-up would show
    assert not np.array_equal(batched[0], batched[1])


def test_static_batch_model_runs_any_batch(tmp_path: Path) -> None:
    static = LipSyncAdapter.from_path(tiny_lipsync(tmp_path / "s.onnx", batch=1), SPEC)
    dynamic = LipSyncAdapter.from_path(tiny_lipsync(tmp_path / "d.onnx"), SPEC)
    assert static.max_batch_size == 1
    assert not static.binding.dynamic_batch
    visual, audio = _inputs(3)
    np.testing.assert_array_equal(static.run(visual, audio), dynamic.run(visual, audio))


def test_raw_run_is_the_float_contract_of_the_faces(tmp_path: Path) -> None:
    adapter = LipSyncAdapter.from_path(tiny_lipsync(tmp_path / "m.onnx"), SPEC)
    regions, audio = _inputs(2)
    builder = FaceInputBuilder(SPEC)
    crops = [np.pad(r, ((4, 4), (4, 4), (0, 0))) for r in regions]  # crop-size canvases
    scaled = np.stack([builder.scaled_input(c) for c in crops])
    raw = adapter.run_raw(scaled, audio)
    assert raw.shape == (2, 3, 320, 320)
    assert raw.dtype == np.float32
    assert 0.0 < raw.min() < raw.max() < 1.0
    # the uint8 path is the same computation, scaled, rounded and transposed to HWC
    expected = np.clip(np.round(raw * np.float32(255.0)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(adapter.run(regions, audio), expected.transpose(0, 2, 3, 1))


def test_model_that_does_not_fit_is_refused_with_shapes(tmp_path: Path) -> None:
    wrong = tiny_lipsync(tmp_path / "w.onnx", size=160)
    with pytest.raises(ModelLoadError, match=r"need a visual input \[B,6,320,320\]") as info:
        LipSyncAdapter.from_path(wrong, SPEC)
    assert "input[batch,6,160,160]" in str(info.value).replace("?", "batch")  # what was found


def test_corrupt_and_missing_files_give_clear_errors(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x01garbage" * 100)
    with pytest.raises(ModelLoadError, match=r"corrupt\.onnx cannot be loaded"):
        LipSyncAdapter.from_path(corrupt, SPEC)
    with pytest.raises(ModelLoadError, match="does not exist"):
        LipSyncAdapter.from_path(tmp_path / "nope.onnx", SPEC)


def test_wrong_request_shapes_are_rejected(tmp_path: Path) -> None:
    adapter = LipSyncAdapter.from_path(tiny_lipsync(tmp_path / "m.onnx"), SPEC)
    visual, audio = _inputs(2)
    with pytest.raises(ModelInputError, match="audio input must be"):
        adapter.run(visual, audio[:1])
    with pytest.raises(ModelInputError, match="visual input must be uint8"):
        adapter.run(visual.astype(np.float32), audio)
    with pytest.raises(ModelInputError, match=r"visual input must be float32 \[B,6,320,320\]"):
        adapter.run_raw(visual.astype(np.float32), audio)


def test_visual_input_reference_and_mask() -> None:
    rng = np.random.default_rng(3)
    crop = rng.integers(1, 256, (328, 328, 3), dtype=np.uint8)  # no zeros, so the mask shows
    visual = FaceInputBuilder(SPEC).visual_input(crop)
    assert visual.shape == (6, 320, 320)
    assert visual.dtype == np.uint8
    inner = crop[4:324, 4:324].transpose(2, 0, 1)
    np.testing.assert_array_equal(visual[:3], inner)
    masked = visual[3:]
    zero = np.all(masked == 0, axis=0)
    rows, cols = np.nonzero(zero)
    # cv2.rectangle(img, (5, 5, 310, 305), 0, -1): rows 5..309, columns 5..314
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (5, 309, 5, 314)
    assert zero.sum() == 305 * 310
    np.testing.assert_array_equal(masked[:, ~zero], inner[:, ~zero])


def test_visual_input_follows_channel_and_colour_order() -> None:
    spec = WAV2LIP_96
    rng = np.random.default_rng(4)
    crop = rng.integers(1, 256, (96, 96, 3), dtype=np.uint8)
    visual = FaceInputBuilder(spec).visual_input(crop)
    rgb = crop[:, :, ::-1].transpose(2, 0, 1)
    np.testing.assert_array_equal(visual[3:], rgb)  # reference second
    assert np.all(visual[:3, 48:, :] == 0)  # lower half masked, first
    np.testing.assert_array_equal(visual[:3, :48, :], rgb[:, :48, :])
