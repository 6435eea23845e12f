"""The serving graph: a lip-sync model wrapped to take uint8 regions and give uint8 faces.

Checked against the host path it replaced, computed here with numpy and a plain session
on the unwrapped model: the six-channel input built from the crop (masked copy, channel
and colour order, scaling), and the output scaled, rounded half to even, saturated and
interleaved. Both adapters the issue names: SyncTalk_2D unet_328 and a Wav2Lip-style
one (masked first, RGB, 96 px, [-1, 1], mel audio).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference_core.adapter.lipsync import FaceInputBuilder, LipSyncAdapter
from inference_core.adapter.serving_graph import (
    AUDIO,
    CROPS,
    FACES,
    RAW,
    SCALED,
    load_serving_graph,
)
from inference_core.adapter.spec import AdapterSpec
from inference_core.assets.demo_models import build_lipsync_model
from inference_core.exceptions import ModelLoadError
from tests.onnx_builders import WAV2LIP_96, tiny_lipsync

UNET = AdapterSpec()
WAV2LIP = WAV2LIP_96


def _crops(spec: AdapterSpec, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, spec.crop_size, spec.crop_size, 3), dtype=np.uint8)


def _audio(spec: AdapterSpec, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, *spec.audio_shape)).astype(np.float32)


def host_path(
    model: Path, spec: AdapterSpec, crops: np.ndarray, audio: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What lipstream computed on the host before the serving graph: (faces, raw)."""
    builder = FaceInputBuilder(spec)
    scaled = np.stack([builder.scaled_input(c) for c in crops])
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    visual_name = next(n for n in names if "aud" not in n)
    audio_name = next(n for n in names if n != visual_name)
    raw = session.run(None, {visual_name: scaled, audio_name: audio})[0]
    if spec.output_scale == "zero_one":
        pixels = raw * np.float32(255.0)
    else:
        pixels = raw * np.float32(127.5) + np.float32(127.5)
    planes = np.clip(np.round(pixels), 0, 255).astype(np.uint8)  # np.round: half to even
    if spec.color_order == "rgb":
        planes = planes[:, ::-1]
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), raw


def _adapter(
    model: Path, spec: AdapterSpec, *, raw_branch: bool, max_batch_size: int = 8
) -> LipSyncAdapter:
    """The model wrapped with the raw API's branch (as on a CPU device) or without (GPU)."""
    graph = load_serving_graph(model, spec, raw_branch=raw_branch)
    session = ort.InferenceSession(graph.serialized(), providers=["CPUExecutionProvider"])
    return LipSyncAdapter(session, spec, graph.binding, max_batch_size=max_batch_size)


def _regions(spec: AdapterSpec, crops: np.ndarray) -> np.ndarray:
    builder = FaceInputBuilder(spec)
    return np.stack([builder.model_region(c) for c in crops])


@pytest.mark.parametrize(
    ("spec", "build"),
    [
        (UNET, lambda p: build_lipsync_model(p)),
        (UNET, lambda p: tiny_lipsync(p, squash=False)),
        (WAV2LIP, lambda p: tiny_lipsync(p, size=96, audio_shape=(1, 80, 16), squash=False)),
    ],
    ids=["unet_328-demo", "unet_328-unbounded", "wav2lip_96"],
)
@pytest.mark.parametrize("raw_branch", [True, False], ids=["cpu-graph", "gpu-graph"])
def test_wrapped_model_is_bit_exact_with_the_host_path(
    tmp_path: Path, spec: AdapterSpec, build: object, raw_branch: bool
) -> None:
    model = tmp_path / "m.onnx"
    build(model)  # type: ignore[operator]
    crops, audio = _crops(spec, 5, seed=1), _audio(spec, 5, seed=2)
    want_faces, want_raw = host_path(model, spec, crops, audio)
    adapter = _adapter(model, spec, raw_branch=raw_branch, max_batch_size=2)  # chunks 2, 2, 1
    faces = adapter.run(_regions(spec, crops), audio)
    np.testing.assert_array_equal(faces, want_faces)
    builder = FaceInputBuilder(spec)
    raw = adapter.run_raw(np.stack([builder.scaled_input(c) for c in crops]), audio)
    np.testing.assert_array_equal(raw, want_raw)
    assert len({faces[i].tobytes() for i in range(5)}) == 5  # frames really differ


def test_unbounded_outputs_saturate(tmp_path: Path) -> None:
    model = tiny_lipsync(tmp_path / "m.onnx", squash=False)
    adapter = LipSyncAdapter.from_path(model, UNET)
    faces = adapter.run(_regions(UNET, _crops(UNET, 2, 3)), _audio(UNET, 2, 4))
    spread = np.random.default_rng(5).uniform(-3, 3, (2, 6, 320, 320)).astype(np.float32)
    raw = adapter.run_raw(spread, _audio(UNET, 2, 4))
    assert raw.min() < 0.0  # the model leaves the pixel range...
    assert raw.max() > 1.0
    assert faces.min() == 0  # ...and faces clip to it
    assert faces.max() == 255


@pytest.mark.parametrize("raw_branch", [True, False], ids=["cpu-graph", "gpu-graph"])
def test_the_masked_region_never_reaches_the_model(tmp_path: Path, raw_branch: bool) -> None:
    """Pixels inside mask_rect only reach the model through the reference half."""
    model = tmp_path / "m.onnx"
    build_lipsync_model(model)
    graph = load_serving_graph(model, UNET, raw_branch=raw_branch)
    # Expose the model's visual input to read what the graph built.
    probe = onnx.ModelProto()
    probe.CopyFrom(graph.model)
    visual = graph.binding.visual_name
    probe.graph.output.append(
        helper.make_tensor_value_info(visual, TensorProto.FLOAT, ["b", 6, 320, 320])
    )
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    crops = _crops(UNET, 2, 5)
    empty = np.zeros((0, 6, 320, 320), np.float32)
    built = session.run(
        [visual], {CROPS: _regions(UNET, crops), SCALED: empty, AUDIO: _audio(UNET, 2, 6)}
    )[0]
    builder = FaceInputBuilder(UNET)
    np.testing.assert_array_equal(built, np.stack([builder.scaled_input(c) for c in crops]))
    x, y, w, h = UNET.mask_rect
    assert not built[:, 3:, y : y + h, x : x + w].any()


@pytest.mark.parametrize("raw_branch", [True, False], ids=["cpu-graph", "gpu-graph"])
def test_static_batch_export_and_one_run_mixing_faces_and_raw(
    tmp_path: Path, raw_branch: bool
) -> None:
    static = _adapter(tiny_lipsync(tmp_path / "s.onnx", batch=1), UNET, raw_branch=raw_branch)
    dynamic = _adapter(tiny_lipsync(tmp_path / "d.onnx"), UNET, raw_branch=raw_branch)
    assert static.max_batch_size == 1
    assert not static.binding.dynamic_batch
    regions, audio = _regions(UNET, _crops(UNET, 3, 7)), _audio(UNET, 3, 8)
    np.testing.assert_array_equal(static.run(regions, audio), dynamic.run(regions, audio))
    # One run can carry faces' frames and raw frames: crops first, scaled after.
    scaled = np.random.default_rng(9).random((1, 6, 320, 320), dtype=np.float32)
    feeds = {CROPS: regions[:2], SCALED: scaled, AUDIO: audio}
    faces, raw = dynamic.session.run([FACES, RAW], feeds)
    np.testing.assert_array_equal(faces[:2], dynamic.run(regions[:2], audio[:2]))
    np.testing.assert_array_equal(raw[2:], dynamic.run_raw(scaled, audio[2:]))


@pytest.mark.parametrize("raw_branch", [True, False], ids=["cpu-graph", "gpu-graph"])
def test_a_batch_without_raw_frames_is_not_copied_into_a_shared_one(
    tmp_path: Path, raw_branch: bool
) -> None:
    """On the CPU graph a batch of faces alone skips the Concat with the raw API's inputs
    (a copy of the whole float input); one with a raw frame still runs it. Read from
    onnxruntime's own profile of the nodes each run executed."""
    model = tiny_lipsync(tmp_path / "m.onnx")
    graph = load_serving_graph(model, UNET, raw_branch=raw_branch)
    regions, audio = _regions(UNET, _crops(UNET, 2, 14)), _audio(UNET, 3, 15)

    def nodes_run(scaled_rows: int) -> set[str]:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / f"profile{scaled_rows}")
        session = ort.InferenceSession(
            graph.serialized(), options, providers=["CPUExecutionProvider"]
        )
        scaled = np.zeros((scaled_rows, 6, 320, 320), dtype=np.float32)
        session.run([FACES], {CROPS: regions, SCALED: scaled, AUDIO: audio[: 2 + scaled_rows]})
        events = json.loads(Path(session.end_profiling()).read_text())
        suffix = "_kernel_time"
        return {
            e["name"].removesuffix(suffix)
            for e in events
            if e.get("cat") == "Node" and e["name"].endswith(suffix)
        }

    faces_only, mixed = nodes_run(0), nodes_run(1)
    assert "lipstream_scale_in" in faces_only or "lipstream_scale_in_faces" in faces_only
    assert "lipstream_batch" in mixed
    assert ("lipstream_batch" in faces_only) is not raw_branch


def test_fp16_weights_keep_float32_io_and_stay_close(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    build_lipsync_model(model)
    full = LipSyncAdapter.from_path(model, UNET)
    half = LipSyncAdapter.from_path(model, UNET, fp16=True)
    types = {i.name: i.type for i in half.session.get_inputs()}
    assert types == {CROPS: "tensor(uint8)", SCALED: "tensor(float)", AUDIO: "tensor(float)"}
    graph = load_serving_graph(model, UNET, fp16=True).model.graph
    constants = [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute]
    assert any(t.data_type == TensorProto.FLOAT16 for t in [*graph.initializer, *constants])
    regions, audio = _regions(UNET, _crops(UNET, 2, 10)), _audio(UNET, 2, 11)
    diff = np.abs(full.run(regions, audio).astype(np.int16) - half.run(regions, audio))
    assert diff.max() <= 3  # float16 keeps 11 bits: a few levels at most
    assert diff.mean() < 0.05


def _opset10_model(path: Path) -> Path:
    """A model exported with opset 10 (ReduceMean with attribute axes)."""
    weight = np.random.default_rng(0).normal(0, 0.5, (3, 6, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["conv"]),
        helper.make_node("ReduceMean", ["audio"], ["amean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Add", ["conv", "amean"], ["pre"]),
        helper.make_node("Sigmoid", ["pre"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "old",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", 6, 320, 320]),
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["b", 32, 16, 16]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["b", 3, 320, 320])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=6)
    onnx.save(model, str(path))
    return path


def test_old_opsets_are_converted(tmp_path: Path) -> None:
    model = _opset10_model(tmp_path / "old.onnx")
    crops, audio = _crops(UNET, 2, 12), _audio(UNET, 2, 13)
    want, _ = host_path(model, UNET, crops, audio)
    adapter = LipSyncAdapter.from_path(model, UNET)
    np.testing.assert_array_equal(adapter.run(_regions(UNET, crops), audio), want)


def test_models_the_graph_cannot_wrap_are_refused_by_name(tmp_path: Path) -> None:
    clash = onnx.load(str(tiny_lipsync(tmp_path / "c.onnx")))
    clash.graph.node[-1].output[0] = "lipstream_faces"
    clash.graph.output[0].name = "lipstream_faces"
    onnx.save(clash, str(tmp_path / "c.onnx"))
    with pytest.raises(ModelLoadError, match=r"c\.onnx.*lipstream_faces.*rename them"):
        load_serving_graph(tmp_path / "c.onnx", UNET)
    ints = onnx.load(str(tiny_lipsync(tmp_path / "i.onnx")))
    ints.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    onnx.save(ints, str(tmp_path / "i.onnx"))
    with pytest.raises(ModelLoadError, match="must be float32 or float16"):
        load_serving_graph(tmp_path / "i.onnx", UNET)
