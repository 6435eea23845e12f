"""Tiny ONNX models with the real I/O contracts, built in tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inference_core.importers.sources import WAV2LIP_SPEC

#: A Wav2Lip-style adapter (lipstream's Wav2Lip-96 spec) in RGB and [-1, 1], so tests
#: cover the other colour order and scaling too. ``tiny_lipsync(path, size=96,
#: audio_shape=(1, 80, 16))`` fits it.
WAV2LIP_96 = WAV2LIP_SPEC.model_copy(
    update={"color_order": "rgb", "pixel_scale": "minus_one_one", "output_scale": "minus_one_one"}
)


def tiny_lipsync(
    path: Path,
    *,
    visual_name: str = "input",
    audio_name: str = "audio",
    audio_first: bool = False,
    batch: int | str = "batch",
    size: int = 320,
    audio_shape: tuple[int, ...] = (32, 16, 16),
    seed: int = 0,
    squash: bool = True,
) -> Path:
    """A cheap model with unet_328-style I/O whose output depends on every input.

    output = sigmoid(conv1x1(visual) + w · mean(audio)), per sample, so batching bugs
    (mixed-up samples, wrong chunking) change the result. ``squash=False`` leaves out
    the sigmoid: outputs then run past any pixel range (to test saturation).
    """
    rng = np.random.default_rng(seed)
    weight = rng.normal(0, 0.5, (3, 6, 1, 1)).astype(np.float32)
    audio_gain = rng.normal(0, 1.0, (1, 3, 1, 1)).astype(np.float32)
    visual = helper.make_tensor_value_info(visual_name, TensorProto.FLOAT, [batch, 6, size, size])
    audio = helper.make_tensor_value_info(audio_name, TensorProto.FLOAT, [batch, *audio_shape])
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, 3, size, size])
    axes = list(range(1, 1 + len(audio_shape)))
    nodes = [
        helper.make_node("Conv", [visual_name, "w"], ["conv"]),
        helper.make_node("ReduceMean", [audio_name, "axes"], ["amean"], keepdims=0),
        helper.make_node("Reshape", ["amean", "shape4"], ["amean4"]),
        helper.make_node("Mul", ["amean4", "gain"], ["abias"]),
        helper.make_node("Add", ["conv", "abias"], ["pre" if squash else "output"]),
    ]
    if squash:
        nodes.append(helper.make_node("Sigmoid", ["pre"], ["output"]))
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(audio_gain, "gain"),
        numpy_helper.from_array(np.array(axes, dtype=np.int64), "axes"),
        numpy_helper.from_array(np.array([-1, 1, 1, 1], dtype=np.int64), "shape4"),
    ]
    inputs = [audio, visual] if audio_first else [visual, audio]
    graph = helper.make_graph(nodes, "tiny_lipsync", inputs, [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_encoder(path: Path, *, batch: int | str = "batch", seed: int = 0) -> Path:
    """An AVE-shaped encoder: [B,1,80,16] mel → [B,512] through one random linear layer."""
    rng = np.random.default_rng(seed)
    weight = rng.normal(0, 0.05, (1280, 512)).astype(np.float32)
    mel = helper.make_tensor_value_info("mel", TensorProto.FLOAT, [batch, 1, 80, 16])
    out = helper.make_tensor_value_info("emb", TensorProto.FLOAT, [batch, 512])
    nodes = [
        helper.make_node("Reshape", ["mel", "flat"], ["x"]),
        helper.make_node("MatMul", ["x", "w"], ["emb"]),
    ]
    inits = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array([-1, 1280], dtype=np.int64), "flat"),
    ]
    graph = helper.make_graph(nodes, "tiny_encoder", [mel], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, str(path))
    return path
