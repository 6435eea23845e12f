"""A UNet-shaped model with ``unet_328`` I/O and its compute cost, for benchmarks.

The real lip-sync model costs ≈4.9 GMAC per frame (``docs/design/model.md`` §3). The
demo stand-in in :mod:`inference_core.assets.demo_models` costs next to nothing, so
throughput measured with it says nothing about a GPU's capacity. This model has the
same inputs and outputs and, at the default width, the same per-frame cost, with random
(seeded, He-initialised) weights: its pictures are noise, its timing is what matters.

Architecture (``w`` = width)::

    visual [B,6,320,320] ─ conv 6→w ─ s0 ──────────────────────────────────────┐
      ─ conv/2 w→2w, conv ─ s1 (160) ───────────────────────────────────┐      │
      ─ conv/2 2w→4w, conv ─ s2 (80) ───────────────────────────┐       │      │
      ─ conv/2 4w→8w, conv ─ s3 (40) ───────────────────┐       │       │      │
      ─ conv/2 8w→16w, conv ─ s4 (20) ──────────┐       │       │       │      │
      ─ conv/2 16w→32w, conv (10) ┐             │       │       │       │      │
    audio [B,32,16,16] ─ conv 32→8w, conv ─ resize 10×10 ┘            │      │
      concat ─ conv →32w ─ up×2, conv →16w, concat s4, conv →16w ─ up … (40, 80, 160)
      … up×2, conv 2w→w, concat s0 ─ conv1×1 2w→3 ─ Sigmoid → output [B,3,320,320]

Every 3×3 conv is followed by ReLU. Upsampling is nearest-neighbour ``Resize``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inference_core.exceptions import ModelLoadError

logger = logging.getLogger(__name__)

OPSET = 17
INPUT_SIZE = 320
VISUAL_CHANNELS = 6
AUDIO_CHANNELS = 32
AUDIO_SIZE = 16
# Stride-2 stages after the full-resolution stem: 320 → 160 → 80 → 40 → 20 → 10.
DOWN_STAGES = 5
BOTTLENECK_SIZE = INPUT_SIZE >> DOWN_STAGES
# 14 gives 4.96 GMAC per frame (the real unet_328: ≈4.9) and 8.4 M parameters.
DEFAULT_WIDTH = 14


def _audio_channels(width: int) -> int:
    return 8 * width


def estimate_macs(width: int = DEFAULT_WIDTH) -> int:
    """Multiply-accumulates per frame of :func:`build_benchmark_unet` at ``width``.

    Counted from the architecture, conv by conv (a k×k conv producing ``cout × h × w``
    from ``cin`` channels costs ``k² · cin · cout · h · w``); element-wise ops, resizes
    and biases are left out, as MAC counts usually do.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")

    def conv(k: int, cin: int, cout: int, size: int) -> int:
        return k * k * cin * cout * size * size

    total = conv(3, VISUAL_CHANNELS, width, INPUT_SIZE)
    channels = width
    for stage in range(1, DOWN_STAGES + 1):
        size = INPUT_SIZE >> stage
        total += conv(3, channels, 2 * channels, size) + conv(3, 2 * channels, 2 * channels, size)
        channels *= 2
    audio = _audio_channels(width)
    total += conv(3, AUDIO_CHANNELS, audio, AUDIO_SIZE) + conv(3, audio, audio, AUDIO_SIZE)
    total += conv(3, channels + audio, channels, BOTTLENECK_SIZE)
    for stage in range(DOWN_STAGES - 1, -1, -1):
        size = INPUT_SIZE >> stage
        half = channels // 2
        total += conv(3, channels, half, size)  # after the ×2 upsample
        if stage > 0:
            total += conv(3, channels, half, size)  # after concatenating the skip
        channels = half
    total += conv(1, 2 * width, 3, INPUT_SIZE)
    return total


class _GraphBuilder:
    """Accumulates nodes and He-initialised weights with a seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def conv(
        self, x: str, cin: int, cout: int, *, kernel: int = 3, stride: int = 1, relu: bool = True
    ) -> str:
        name = self._name("conv")
        fan_in = cin * kernel * kernel
        weight = self._rng.standard_normal((cout, cin, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        self.initializers.append(numpy_helper.from_array(weight.astype(np.float32), f"{name}.w"))
        self.initializers.append(
            numpy_helper.from_array(np.zeros(cout, dtype=np.float32), f"{name}.b")
        )
        pad = kernel // 2
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.w", f"{name}.b"],
                [name],
                name=name,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        if not relu:
            return name
        out = f"{name}.relu"
        self.nodes.append(helper.make_node("Relu", [name], [out], name=out))
        return out

    def resize(self, x: str, scale: float, mode: str) -> str:
        name = self._name("resize")
        scales = np.array([1.0, 1.0, scale, scale], dtype=np.float32)
        self.initializers.append(numpy_helper.from_array(scales, f"{name}.scales"))
        self.nodes.append(
            helper.make_node("Resize", [x, "", f"{name}.scales"], [name], name=name, mode=mode)
        )
        return name

    def concat(self, *inputs: str) -> str:
        name = self._name("concat")
        self.nodes.append(helper.make_node("Concat", list(inputs), [name], name=name, axis=1))
        return name


def build_benchmark_unet(path: Path, *, width: int = DEFAULT_WIDTH, seed: int = 0) -> Path:
    """Write the benchmark UNet to ``path`` and return ``path``.

    Inputs ``input`` ``[batch, 6, 320, 320]`` and ``audio`` ``[batch, 32, 16, 16]``,
    output ``output`` ``[batch, 3, 320, 320]`` in (0, 1); opset 17, dynamic ``batch``.
    Costs :func:`estimate_macs` ``(width)`` MACs per frame. Same arguments, same bytes.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    g = _GraphBuilder(seed)
    skips: list[tuple[str, int]] = []
    x = g.conv("input", VISUAL_CHANNELS, width)
    channels = width
    for _ in range(DOWN_STAGES):
        skips.append((x, channels))
        x = g.conv(x, channels, 2 * channels, stride=2)
        x = g.conv(x, 2 * channels, 2 * channels)
        channels *= 2

    audio_channels = _audio_channels(width)
    a = g.conv("audio", AUDIO_CHANNELS, audio_channels)
    a = g.conv(a, audio_channels, audio_channels)
    # 16×16 → 10×10 so the audio meets the visual bottleneck on the same grid.
    a = g.resize(a, BOTTLENECK_SIZE / AUDIO_SIZE, "linear")
    x = g.conv(g.concat(x, a), channels + audio_channels, channels)

    for skip, skip_channels in reversed(skips):
        half = channels // 2
        x = g.conv(g.resize(x, 2.0, "nearest"), channels, half)
        x = g.concat(x, skip)
        channels = half + skip_channels
        if skip_channels != width:
            x = g.conv(x, channels, half)
            channels = half
    x = g.conv(x, channels, 3, kernel=1, relu=False)
    g.nodes.append(helper.make_node("Sigmoid", [x], ["output"], name="sigmoid"))

    graph = helper.make_graph(
        g.nodes,
        "benchmark_unet",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.FLOAT, ["batch", VISUAL_CHANNELS, INPUT_SIZE, INPUT_SIZE]
            ),
            helper.make_tensor_value_info(
                "audio", TensorProto.FLOAT, ["batch", AUDIO_CHANNELS, AUDIO_SIZE, AUDIO_SIZE]
            ),
        ],
        [
            helper.make_tensor_value_info(
                "output", TensorProto.FLOAT, ["batch", 3, INPUT_SIZE, INPUT_SIZE]
            )
        ],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lipstream",
        producer_version="1",
        doc_string=f"lipstream benchmark UNet (random weights), width {width}, seed {seed}",
    )
    model.ir_version = 8
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"generated benchmark model failed the ONNX checker: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    logger.info(
        "wrote benchmark UNet %s: width %d, %.2f GMAC/frame, %d bytes",
        path,
        width,
        estimate_macs(width) / 1e9,
        path.stat().st_size,
    )
    return path
