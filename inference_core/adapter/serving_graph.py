"""The serving graph: a lip-sync model wrapped to take uint8 regions and give uint8 faces.

At load, the model's float interface is wrapped in ONNX nodes that do what the adapter
spec describes: reorder colours and channels, build the masked copy, scale to floats,
and on the way out scale back, round, saturate and interleave. On a GPU those steps run
on the device, so only uint8 crosses the bus (``docs/design/model.md`` §3): a 320×320
BGR region is 307 KB in (the float32 six-channel input was 2.46 MB) and a face 307 KB
out (the float32 output was 1.23 MB).

The wrapped graph, for ``S`` = input size (the region is the crop's inner ``S×S``)::

    crops   uint8   [n, S, S, 3]        BGR regions, as OpenCV holds them
    scaled  float32 [r, 6, S, S]        inputs already scaled (the raw API); r is often 0
    audio   float32 [n + r, *audio]     one window per frame, crops' frames first
      ──▶ faces   uint8   [n + r, S, S, 3]   BGR faces, ready to paste
      ──▶ raw     float32 [n + r, 3, S, S]   the model's own output

One graph serves both kinds of request, in one run: the scaled inputs are concatenated
after the crops' on the batch axis, so a raw request costs no second session (and no
second copy of the weights on the device).

Why one module of about 500 lines: the nodes are built in one pass over one graph and
share its names (the ``lipstream_`` prefix, checked against the model's own); split,
the steps would pass those names and their order between modules.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inference_core.adapter.onnx_io import Dim, ModelBinding, bind_inputs
from inference_core.adapter.spec import AdapterSpec
from inference_core.exceptions import ModelLoadError

CROPS = "lipstream_crops"
SCALED = "lipstream_scaled"
AUDIO = "lipstream_audio"
FACES = "lipstream_faces"
RAW = "lipstream_raw"
_PREFIX = "lipstream_"
# Round, Clip with min/max inputs and Slice with input starts need opset 11; older
# models are converted up to this one.
_MIN_OPSET = 11
_CONVERT_TO_OPSET = 13
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)


@dataclass(frozen=True)
class ServingGraph:
    """A wrapped model, what was found wrapping it, and the file it came from."""

    model: onnx.ModelProto
    binding: ModelBinding  # which original input/output was which
    source: Path | None = None

    def serialized(self) -> bytes:
        data: bytes = self.model.SerializeToString()
        return data


def load_serving_graph(
    path: Path, spec: AdapterSpec, *, fp16: bool = False, raw_branch: bool = False
) -> ServingGraph:
    """Read ``path`` and wrap it; every failure is a :class:`ModelLoadError` naming the file.

    ``raw_branch`` as for :func:`wrap_model` (on for a session on the CPU). ``fp16``
    converts the model's weights and arithmetic to float16 first (its inputs and outputs
    stay float32, so the wrapping and the raw API do not change).
    """
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError, OSError, onnx's own errors
        raise ModelLoadError(
            f"model file {path} cannot be loaded: not a readable ONNX model ({exc})"
        ) from exc
    try:
        if fp16:
            model = to_fp16(model)
        graph = wrap_model(model, spec, raw_branch=raw_branch)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return ServingGraph(graph.model, graph.binding, path)


def read_binding(path: Path, spec: AdapterSpec) -> ModelBinding:
    """Which of ``path``'s own inputs and output is which, without loading it onto a device.

    For the inference protocols' metadata of a model not loaded yet (its tensors' own
    names). Reads and parses the file (≈0.1 s for a 49 MB model: call it off the event
    loop); the answer is kept per file version, so asking again costs a ``stat``.
    """
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"model file {path} cannot be read: {exc}") from exc
    return _read_binding(path, stat.st_mtime_ns, stat.st_size, spec)


@functools.lru_cache(maxsize=256)
def _read_binding(path: Path, mtime_ns: int, size: int, spec: AdapterSpec) -> ModelBinding:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError, onnx's own errors
        raise ModelLoadError(
            f"model file {path} cannot be loaded: not a readable ONNX model ({exc})"
        ) from exc
    try:
        return model_binding(model, spec)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with float16 weights and arithmetic, float32 inputs and outputs kept."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        converted: onnx.ModelProto = convert_float_to_float16(model, keep_io_types=True)
    except Exception as exc:  # the converter raises whatever the graph walk hits
        raise ModelLoadError(f"model cannot be converted to float16: {exc}") from exc
    return converted


def graph_dims(values: Sequence[onnx.ValueInfoProto]) -> list[tuple[str, list[Dim]]]:
    """Names and declared dims of graph inputs or outputs (``None`` where unknown)."""
    found = []
    for value in values:
        dims: list[Dim] = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            else:
                dims.append(dim.dim_param or None)
        found.append((value.name, dims))
    return found


def model_binding(model: onnx.ModelProto, spec: AdapterSpec) -> ModelBinding:
    """Match ``model``'s inputs and output to the adapter by shape (initializers excluded)."""
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    inputs = [v for v in graph.input if v.name not in constants]
    return bind_inputs(graph_dims(inputs), graph_dims(graph.output), spec)


def wrap_model(
    model: onnx.ModelProto, spec: AdapterSpec, *, raw_branch: bool = False
) -> ServingGraph:
    """Wrap ``model`` (a float lip-sync model bound to ``spec``) into the serving graph.

    ``raw_branch`` (for a CPU session) adds the raw API's inputs to a batch only when it
    has any (:func:`_raw_branch`); without it they are always concatenated, which on a
    GPU is a copy in device memory, too cheap to be worth a branch nobody measured there.

    Raises :class:`ModelLoadError` when the model does not fit the spec or cannot be
    brought to opset 11.
    """
    binding = model_binding(model, spec)
    model = _with_opset(model)
    graph = model.graph
    _check_names(graph)
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}
    for name in (binding.visual_name, binding.audio_name, binding.output_name):
        if types[name] not in _FLOATS:
            raise ModelLoadError(
                f"model tensor {name!r} is {TensorProto.DataType.Name(types[name])}; "
                "a lip-sync model's inputs and output must be float32 or float16"
            )
    batch = "batch" if binding.dynamic_batch else 1
    s = spec.input_size
    new_inputs = [
        helper.make_tensor_value_info(CROPS, TensorProto.UINT8, ["crops", s, s, 3]),
        helper.make_tensor_value_info(SCALED, TensorProto.FLOAT, ["scaled", *spec.visual_shape]),
        helper.make_tensor_value_info(AUDIO, TensorProto.FLOAT, [batch, *spec.audio_shape]),
    ]
    new_outputs = [
        helper.make_tensor_value_info(FACES, TensorProto.UINT8, [batch, s, s, 3]),
        helper.make_tensor_value_info(RAW, TensorProto.FLOAT, [batch, *spec.output_shape]),
    ]
    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    g = wrapped.graph
    output_type = types[binding.output_name]
    if output_type == TensorProto.FLOAT:
        # Renamed where it is made, so the raw output costs no Identity copy.
        _rename(g, binding.output_name, RAW)
    kept_inputs = [v for v in g.input if v.name not in (binding.visual_name, binding.audio_name)]
    before = [
        *_input_nodes(spec, binding.visual_name, types[binding.visual_name], raw_branch=raw_branch),
        *_cast_or_identity(AUDIO, binding.audio_name, types[binding.audio_name]),
    ]
    after = _output_nodes(spec, binding.output_name, output_type)
    model_nodes = list(g.node)
    del g.input[:]
    g.input.extend([*new_inputs, *kept_inputs])
    del g.output[:]
    g.output.extend(new_outputs)
    del g.node[:]
    g.node.extend([*before, *model_nodes, *after])  # ONNX wants nodes in topological order
    return ServingGraph(wrapped, binding)


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename tensor ``old`` to ``new`` wherever the graph's nodes make or read it."""
    for node in graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == old:
                    names[i] = new


def _with_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version >= _MIN_OPSET:
        return model
    try:
        from onnx import version_converter

        return version_converter.convert_version(model, _CONVERT_TO_OPSET)
    except Exception as exc:  # the converter raises bare RuntimeError/ConvertError
        raise ModelLoadError(
            f"model uses ONNX opset {version} and could not be converted to opset "
            f"{_CONVERT_TO_OPSET} ({exc}); export it again with opset {_MIN_OPSET} or newer"
        ) from exc


def _check_names(graph: onnx.GraphProto) -> None:
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names.update(i.name for i in graph.initializer)
    names.update(n for node in graph.node for n in (*node.input, *node.output, node.name))
    clash = sorted(n for n in names if n.startswith(_PREFIX))
    if clash:
        raise ModelLoadError(
            f"model already has tensors named {', '.join(clash[:3])}: the {_PREFIX}* names "
            "are lipstream's; rename them in the export"
        )


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], name=name, value=numpy_helper.from_array(value, name=name)
    )


def _ints(name: str, values: Sequence[int]) -> onnx.NodeProto:
    return _const(name, np.asarray(values, dtype=np.int64))


def _plus(nodes: list[onnx.NodeProto], source: str, offset: float, name: str) -> str:
    """Append ``name = source + offset`` (float32) to ``nodes`` unless ``offset`` is 0."""
    if not offset:
        return source
    nodes += [
        _const(f"{name}_value", np.asarray(offset, dtype=np.float32)),
        helper.make_node("Add", [source, f"{name}_value"], [name], name=name),
    ]
    return name


def _cast_or_identity(source: str, target: str, elem_type: int) -> list[onnx.NodeProto]:
    """``target`` = ``source`` as ``elem_type`` (Identity when it already is float32)."""
    if elem_type == TensorProto.FLOAT:
        return [helper.make_node("Identity", [source], [target], name=f"{_PREFIX}{target}_in")]
    return [helper.make_node("Cast", [source], [target], to=elem_type, name=f"{_PREFIX}{target}")]


def _scale(pixel_scale: str) -> tuple[float, float]:
    """(multiplier, offset) taking uint8 pixels to the model's range, as numpy did it."""
    return (1.0 / 255.0, 0.0) if pixel_scale == "zero_one" else (1.0 / 127.5, -1.0)


def _input_nodes(
    spec: AdapterSpec, visual_name: str, elem_type: int, *, raw_branch: bool
) -> list[onnx.NodeProto]:
    """crops + scaled → the model's visual input, exactly as the adapter describes it.

    Everything before the one DequantizeLinear (``x * scale``, the same float32 product
    numpy computes) moves uint8, a quarter of the bytes of floats; only data-movement ops
    touch uint8, since CUDA has no uint8 arithmetic kernels.
    """
    p = _PREFIX
    s = spec.input_size
    # Pixel-interleaved [n,S,S,3] → planes [n,3,S,S], through a flat [n,S·S,3] view: a
    # Transpose of the 4-D tensor would be moved past the masking by onnxruntime's
    # transpose optimizer and turn the channel Concat into a slow innermost-axis one.
    nodes: list[onnx.NodeProto] = [
        _ints(f"{p}flat_shape", [0, s * s, 3]),
        helper.make_node("Reshape", [CROPS, f"{p}flat_shape"], [f"{p}flat"], name=f"{p}flat"),
        helper.make_node(
            "Transpose", [f"{p}flat"], [f"{p}flat_chw"], perm=[0, 2, 1], name=f"{p}chw"
        ),
        _ints(f"{p}chw_shape", [0, 3, s, s]),
        helper.make_node(
            "Reshape", [f"{p}flat_chw", f"{p}chw_shape"], [f"{p}planes_bgr"], name=f"{p}planes"
        ),
    ]
    planes = f"{p}planes_bgr"
    if spec.color_order == "rgb":
        nodes += [
            _ints(f"{p}to_rgb", [2, 1, 0]),
            helper.make_node("Gather", [planes, f"{p}to_rgb"], [f"{p}rgb"], axis=1, name=f"{p}rgb"),
        ]
        planes = f"{p}rgb"
    nodes += _masked_copy(spec, planes, f"{p}masked")
    halves = [f"{p}masked", planes]
    if spec.channel_order == "reference_first":
        halves.reverse()
    multiplier, offset = _scale(spec.pixel_scale)
    nodes += [
        helper.make_node("Concat", halves, [f"{p}six"], axis=1, name=f"{p}six"),
        _const(f"{p}in_scale", np.asarray(multiplier, dtype=np.float32)),
        _const(f"{p}in_zero", np.asarray(0, dtype=np.uint8)),
    ]

    def scaled_crops(suffix: str) -> tuple[list[onnx.NodeProto], str]:
        steps = [
            helper.make_node(
                "DequantizeLinear",
                [f"{p}six", f"{p}in_scale", f"{p}in_zero"],
                [f"{p}six_f{suffix}"],
                name=f"{p}scale_in{suffix}",
            )
        ]
        return steps, _plus(steps, f"{p}six_f{suffix}", offset, f"{p}in_offset{suffix}")

    if not raw_branch:
        steps, crops_f = scaled_crops("")
        nodes += [
            *steps,
            helper.make_node("Concat", [crops_f, SCALED], [f"{p}visual"], axis=0, name=f"{p}batch"),
        ]
    else:
        nodes += _raw_branch(scaled_crops("_mixed"), scaled_crops("_faces"), f"{p}visual")
    nodes += _cast_or_identity(f"{p}visual", visual_name, elem_type)
    return nodes


def _raw_branch(
    mixed: tuple[list[onnx.NodeProto], str], faces: tuple[list[onnx.NodeProto], str], out: str
) -> list[onnx.NodeProto]:
    """``out`` = the scaled crops, with the raw API's inputs after them only when a batch
    has any: an If on ``SCALED``'s row count. Without raw frames the branch's last node
    writes the model's input itself, where a Concat with an empty ``SCALED`` copies the
    whole float input once more (on a CPU, a pass over 2.5 MB a frame)."""
    p = _PREFIX
    mixed_nodes, mixed_out = mixed
    faces_nodes, faces_out = faces
    mixed_nodes = [
        *mixed_nodes,
        helper.make_node(
            "Concat", [mixed_out, SCALED], [f"{p}visual_mixed"], axis=0, name=f"{p}batch"
        ),
    ]

    def branch(name: str, steps: list[onnx.NodeProto], result: str) -> onnx.GraphProto:
        output = helper.make_tensor_value_info(result, TensorProto.FLOAT, None)
        return helper.make_graph(steps, f"{p}{name}", [], [output])

    return [
        helper.make_node("Shape", [SCALED], [f"{p}scaled_shape"], name=f"{p}scaled_shape"),
        _const(f"{p}rows_axis", np.asarray(0, dtype=np.int64)),
        helper.make_node(
            "Gather",
            [f"{p}scaled_shape", f"{p}rows_axis"],
            [f"{p}scaled_rows"],
            axis=0,
            name=f"{p}scaled_rows",
        ),
        helper.make_node(
            "Cast", [f"{p}scaled_rows"], [f"{p}any_scaled"], to=TensorProto.BOOL, name=f"{p}any"
        ),
        helper.make_node(
            "If",
            [f"{p}any_scaled"],
            [out],
            then_branch=branch("with_raw", mixed_nodes, f"{p}visual_mixed"),
            else_branch=branch("faces_only", faces_nodes, faces_out),
            name=f"{p}raw_branch",
        ),
    ]


def _masked_copy(spec: AdapterSpec, planes: str, out: str) -> list[onnx.NodeProto]:
    """``out`` = uint8 ``[n,3,S,S]`` ``planes`` with ``mask_rect`` zeroed, by slicing.

    Rows above and below the rect are kept; the rect's rows are rebuilt as left part,
    zeros, right part. The zeros are one pixel expanded to ``[n,3,h,w]``.
    """
    p = _PREFIX
    x, y, w, h = spec.mask_rect
    s = spec.input_size
    nodes: list[onnx.NodeProto] = []

    def piece(name: str, axis: int, start: int, stop: int, source: str) -> str:
        nodes.extend(
            [
                _ints(f"{p}{name}_start", [start]),
                _ints(f"{p}{name}_stop", [stop]),
                _ints(f"{p}{name}_axis", [axis]),
                helper.make_node(
                    "Slice",
                    [source, f"{p}{name}_start", f"{p}{name}_stop", f"{p}{name}_axis"],
                    [f"{p}{name}"],
                    name=f"{p}{name}",
                ),
            ]
        )
        return f"{p}{name}"

    band = piece("mask_band", 2, y, y + h, planes)
    nodes += [
        _ints(f"{p}mask_shape_tail", [3, h, w]),
        helper.make_node("Shape", [planes], [f"{p}planes_shape"], name=f"{p}planes_shape"),
    ]
    batch = piece("mask_batch", 0, 0, 1, f"{p}planes_shape")
    nodes += [
        helper.make_node(
            "Concat",
            [batch, f"{p}mask_shape_tail"],
            [f"{p}zeros_shape"],
            axis=0,
            name=f"{p}zeros_shape",
        ),
        _const(f"{p}zero_px", np.zeros((1, 1, 1, 1), dtype=np.uint8)),
        helper.make_node(
            "Expand", [f"{p}zero_px", f"{p}zeros_shape"], [f"{p}zeros"], name=f"{p}zeros"
        ),
    ]
    row_parts = []
    if x > 0:
        row_parts.append(piece("mask_left", 3, 0, x, band))
    row_parts.append(f"{p}zeros")
    if x + w < s:
        row_parts.append(piece("mask_right", 3, x + w, s, band))
    rows = [] if y == 0 else [piece("mask_top", 2, 0, y, planes)]
    if len(row_parts) > 1:
        nodes.append(
            helper.make_node("Concat", row_parts, [f"{p}mask_rows"], axis=3, name=f"{p}mask_rows")
        )
        rows.append(f"{p}mask_rows")
    else:
        rows.append(row_parts[0])
    if y + h < s:
        rows.append(piece("mask_bottom", 2, y + h, s, planes))
    if len(rows) > 1:
        nodes.append(helper.make_node("Concat", rows, [out], axis=2, name=f"{p}masked"))
    else:
        nodes.append(helper.make_node("Identity", rows, [out], name=f"{p}masked"))
    return nodes


def _output_nodes(spec: AdapterSpec, output_name: str, elem_type: int) -> list[onnx.NodeProto]:
    """The model's output (already renamed ``RAW`` when float32) → uint8 BGR ``[B,S,S,3]``.

    The same float32 ``y * scale + offset`` as OpenCV's ``addWeighted``, then
    QuantizeLinear with step 1 rounds half to even and saturates: bit-exact with the
    adapter's host path.
    """
    p = _PREFIX
    nodes: list[onnx.NodeProto] = []
    if elem_type != TensorProto.FLOAT:
        nodes.append(
            helper.make_node("Cast", [output_name], [RAW], to=TensorProto.FLOAT, name=f"{p}raw")
        )
    multiplier, offset = (255.0, 0.0) if spec.output_scale == "zero_one" else (127.5, 127.5)
    nodes += [
        _const(f"{p}out_scale", np.asarray(multiplier, dtype=np.float32)),
        helper.make_node("Mul", [RAW, f"{p}out_scale"], [f"{p}out_f"], name=f"{p}scale_out"),
    ]
    scaled = _plus(nodes, f"{p}out_f", offset, f"{p}out_offset")
    nodes += [
        # Scale 1: round half to even and saturate, nothing else.
        _const(f"{p}out_step", np.asarray(1.0, dtype=np.float32)),
        _const(f"{p}out_zero", np.asarray(0, dtype=np.uint8)),
        helper.make_node(
            "QuantizeLinear",
            [scaled, f"{p}out_step", f"{p}out_zero"],
            [f"{p}out_u8"],
            name=f"{p}to_u8",
        ),
    ]
    planes = f"{p}out_u8"
    if spec.color_order == "rgb":
        nodes += [
            _ints(f"{p}to_bgr", [2, 1, 0]),
            helper.make_node(
                "Gather", [planes, f"{p}to_bgr"], [f"{p}out_bgr"], axis=1, name=f"{p}bgr"
            ),
        ]
        planes = f"{p}out_bgr"
    nodes.append(
        helper.make_node("Transpose", [planes], [FACES], perm=[0, 2, 3, 1], name=f"{p}hwc")
    )
    return nodes
