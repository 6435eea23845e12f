"""Stand-ins for the trained models, for the built-in demo avatar and for tests.

Neither model here was trained. They have the exact inputs and outputs of SyncTalk_2D's
``unet_328`` lip-sync model and its "ave" audio encoder, and they react to audio in a way a
person can see and a test can measure: the encoder packs per-mel-frame loudness into its
512-d embedding, and the lip-sync model reads that loudness back for the frame's own time
and draws an open mouth over the reference crop, wider the louder the audio.

Both are plain ONNX graphs (opset 17, dynamic batch axis ``batch``) built with
``onnx.helper`` from fixed numbers, so the same call always writes the same bytes.
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
EMBEDDING_SIZE = 512
MEL_BANDS = 80
MEL_STEPS = 16
INPUT_SIZE = 320
AUDIO_WINDOW = 16

# The seed of the basis both models share; changing it changes both files.
_BASIS_SEED = 20240611

# Where the demo avatar draws its mouth; the lip-sync stand-in opens a mouth at the same
# place (fractions of the model's 320×320 input).
DEFAULT_MOUTH_CENTER: tuple[float, float] = (0.5, 0.42)
DEFAULT_MOUTH_HALF_WIDTH = 0.16
DEFAULT_MOUTH_MAX_HALF_HEIGHT = 0.10

# Loudness L = (mean mel + 4) / 8 measured on espeak-ng speech at 16 kHz: 0 in digital
# silence, 0.13 for white noise at -60 dBFS, 0.25-0.42 while speaking (median ~0.37).
# Below 0.15 the mouth stays shut (room noise), from 0.35 it is fully open.
DEFAULT_LOUDNESS_CLOSED = 0.15
DEFAULT_LOUDNESS_OPEN = 0.35

# Feature row 8 of the 16-row window is the frame's own feature; its mel window starts
# ~40 ms before the frame time, so its first five steps (12.5 ms each) cover t-40..t+22 ms.
_OWN_ROW = 8
_OWN_STEPS = 5

_COLOR_LIPS = (0.33, 0.30, 0.62)  # BGR: muted red
_COLOR_MOUTH = (0.10, 0.07, 0.20)  # BGR: dark red-brown interior
_COLOR_TEETH = (0.86, 0.90, 0.93)  # BGR: off-white


def loudness_basis() -> np.ndarray:
    """The ``[16, 512]`` float32 matrix with orthonormal rows that both stand-ins share.

    The encoder writes 16 loudness values as ``L @ basis``; ``embedding @ basis.T``
    gives them back exactly (up to float rounding).
    """
    rng = np.random.default_rng(_BASIS_SEED)
    gaussian = rng.standard_normal((EMBEDDING_SIZE, MEL_STEPS))
    q, r = np.linalg.qr(gaussian)
    # Fix QR's sign freedom so the basis does not depend on the LAPACK build's choices.
    q = q * np.sign(np.diag(r))[np.newaxis, :]
    return np.ascontiguousarray(q.T, dtype=np.float32)


def _const(name: str, value: np.ndarray | float) -> onnx.NodeProto:
    array = np.asarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    return helper.make_node(
        "Constant", [], [name], name=name, value=numpy_helper.from_array(array, name=name)
    )


def _save(model: onnx.ModelProto, path: Path) -> Path:
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:  # a bug here, not a user error
        raise ModelLoadError(f"generated model for {path} failed the ONNX checker: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    logger.debug("wrote %s (%d bytes)", path, path.stat().st_size)
    return path


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lipstream",
        producer_version="1",
        doc_string=doc,
    )
    # Pin the IR version so the bytes do not change with the installed onnx package.
    model.ir_version = 8
    return model


def build_audio_encoder(path: Path) -> Path:
    """Write the stand-in audio encoder ("ave" I/O) to ``path`` and return ``path``.

    Input ``mel`` ``[batch, 1, 80, 16]`` (values in [-4, 4], -4 is silence), output
    ``embedding`` ``[batch, 512]`` = ``L @ loudness_basis()`` with the loudness per mel
    frame ``L_t = (mean over the 80 bands + 4) / 8``. A stand-in, not a trained encoder.
    """
    nodes = [
        helper.make_node("ReduceMean", ["mel"], ["band_mean"], axes=[1, 2], keepdims=0),
        _const("offset", 4.0),
        _const("scale", 0.125),
        helper.make_node("Add", ["band_mean", "offset"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "scale"], ["loudness"]),
        _const("basis", loudness_basis()),
        helper.make_node("MatMul", ["loudness", "basis"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "demo_audio_encoder",
        [
            helper.make_tensor_value_info(
                "mel", TensorProto.FLOAT, ["batch", 1, MEL_BANDS, MEL_STEPS]
            )
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", EMBEDDING_SIZE])],
    )
    doc = "Stand-in audio encoder for lipstream's demo and tests: packs per-step loudness."
    return _save(_model(graph, doc), path)


def _mouth_geometry(
    mouth_center: tuple[float, float], half_width: float
) -> tuple[np.ndarray, np.ndarray]:
    """Column profile ``sqrt(1 - dx²)`` (``[1,1,1,320]``) and row distance ``|dy|`` in px."""
    coords = np.arange(INPUT_SIZE, dtype=np.float64) + 0.5
    dx = (coords - mouth_center[0] * INPUT_SIZE) / (half_width * INPUT_SIZE)
    profile = np.sqrt(np.clip(1.0 - dx * dx, 0.0, None))
    dy = np.abs(coords - mouth_center[1] * INPUT_SIZE)
    return (
        profile.reshape(1, 1, 1, INPUT_SIZE).astype(np.float32),
        dy.reshape(1, 1, INPUT_SIZE, 1).astype(np.float32),
    )


def _color(name: str, bgr: tuple[float, float, float]) -> onnx.NodeProto:
    return _const(name, np.asarray(bgr, dtype=np.float32).reshape(1, 3, 1, 1))


def build_lipsync_model(
    path: Path,
    *,
    mouth_center: tuple[float, float] = DEFAULT_MOUTH_CENTER,
    mouth_half_width: float = DEFAULT_MOUTH_HALF_WIDTH,
    mouth_max_half_height: float = DEFAULT_MOUTH_MAX_HALF_HEIGHT,
    loudness_closed: float = DEFAULT_LOUDNESS_CLOSED,
    loudness_open: float = DEFAULT_LOUDNESS_OPEN,
    edge_px: float = 2.0,
    lip_px: float = 5.0,
) -> Path:
    """Write the stand-in lip-sync model (``unet_328`` I/O) to ``path`` and return ``path``.

    Inputs ``input`` ``[batch, 6, 320, 320]`` (BGR in [0, 1], reference first) and ``audio``
    ``[batch, 32, 16, 16]``; output ``output`` ``[batch, 3, 320, 320]`` in [0, 1].

    Per sample it reads the loudness of the frame's own feature (row 8, channels 16-17,
    mean of its first 5 mel steps), maps it to an openness
    ``o = clip((L - loudness_closed) / (loudness_open - loudness_closed), 0, 1)`` and draws
    on the reference crop an open mouth: a dark ellipse centred at ``mouth_center``
    (fractions of 320) with half-width ``mouth_half_width`` and half-height
    ``o * mouth_max_half_height``, lips around it and upper teeth, edges softened over
    ``edge_px``. At ``o == 0`` every mask is exactly zero, so the output is the reference.
    A stand-in for a trained model, for the demo avatar and tests.
    """
    if not 0.0 <= loudness_closed < loudness_open:
        raise ValueError(
            f"need 0 <= loudness_closed < loudness_open, got {loudness_closed}, {loudness_open}"
        )
    if edge_px <= 0.0 or lip_px < 0.0:
        raise ValueError(f"edge_px must be > 0 and lip_px >= 0, got {edge_px}, {lip_px}")
    profile, row_distance = _mouth_geometry(mouth_center, mouth_half_width)
    max_half_height_px = mouth_max_half_height * INPUT_SIZE
    # Row 8's basis rows folded with the step weights: one [512, 1] read-out vector.
    step_weights = np.zeros((MEL_STEPS, 1), dtype=np.float64)
    step_weights[:_OWN_STEPS, 0] = 1.0 / _OWN_STEPS
    readout = loudness_basis().astype(np.float64).T @ step_weights
    ramp_scale = 1.0 / (loudness_open - loudness_closed)

    channel_lo = 2 * _OWN_ROW
    nodes = [
        # Own-frame feature: channels 16-17 hold feature row 8 (2 × 16 × 16 = 512 values).
        _const("row_starts", np.array([channel_lo], dtype=np.int64)),
        _const("row_ends", np.array([channel_lo + 2], dtype=np.int64)),
        _const("row_axes", np.array([1], dtype=np.int64)),
        helper.make_node("Slice", ["audio", "row_starts", "row_ends", "row_axes"], ["own_row"]),
        _const("flat_shape", np.array([-1, EMBEDDING_SIZE], dtype=np.int64)),
        helper.make_node("Reshape", ["own_row", "flat_shape"], ["own_feature"]),
        _const("readout", readout.astype(np.float32)),
        helper.make_node("MatMul", ["own_feature", "readout"], ["own_loudness"]),  # [B, 1]
        # Openness: clamp ramp from loudness_closed to loudness_open.
        _const("ramp_offset", -loudness_closed),
        _const("ramp_scale", ramp_scale),
        _const("zero", 0.0),
        _const("one", 1.0),
        helper.make_node("Add", ["own_loudness", "ramp_offset"], ["ramp_shifted"]),
        helper.make_node("Mul", ["ramp_shifted", "ramp_scale"], ["ramp"]),
        helper.make_node("Clip", ["ramp", "zero", "one"], ["openness"]),
        _const("openness_shape", np.array([-1, 1, 1, 1], dtype=np.int64)),
        helper.make_node("Reshape", ["openness", "openness_shape"], ["openness_4d"]),
        # Half-heights per column: mouth o*H*profile, lips (o*H + o*lip)*profile, both
        # proportional to o so they vanish exactly when the mouth is closed.
        _const("max_half_height", max_half_height_px),
        _const("lip_half_height", max_half_height_px + lip_px),
        _const("profile", profile),
        _const("row_distance", row_distance),
        _const("inv_edge", 1.0 / edge_px),
        helper.make_node("Mul", ["openness_4d", "max_half_height"], ["mouth_h"]),
        helper.make_node("Mul", ["mouth_h", "profile"], ["mouth_cols"]),  # [B,1,1,320]
        helper.make_node("Sub", ["mouth_cols", "row_distance"], ["mouth_sd"]),  # [B,1,320,320]
        helper.make_node("Mul", ["mouth_sd", "inv_edge"], ["mouth_sd_px"]),
        helper.make_node("Clip", ["mouth_sd_px", "zero", "one"], ["mask_mouth"]),
        helper.make_node("Mul", ["openness_4d", "lip_half_height"], ["lip_h"]),
        helper.make_node("Mul", ["lip_h", "profile"], ["lip_cols"]),
        helper.make_node("Sub", ["lip_cols", "row_distance"], ["lip_sd"]),
        helper.make_node("Mul", ["lip_sd", "inv_edge"], ["lip_sd_px"]),
        helper.make_node("Clip", ["lip_sd_px", "zero", "one"], ["mask_lips"]),
        # Upper teeth: the part of the opening above 45% of its upper half-height.
        _const("teeth_frac", 0.45),
        _const("upper_rows", _upper_rows(mouth_center)),
        helper.make_node("Mul", ["mouth_cols", "teeth_frac"], ["teeth_cols"]),
        helper.make_node("Sub", ["upper_rows", "teeth_cols"], ["teeth_sd"]),
        helper.make_node("Mul", ["teeth_sd", "inv_edge"], ["teeth_sd_px"]),
        helper.make_node("Clip", ["teeth_sd_px", "zero", "one"], ["teeth_band"]),
        helper.make_node("Mul", ["teeth_band", "mask_mouth"], ["mask_teeth"]),
        # Reference crop: channels 0-2 of the visual input.
        _const("ref_starts", np.array([0], dtype=np.int64)),
        _const("ref_ends", np.array([3], dtype=np.int64)),
        helper.make_node("Slice", ["input", "ref_starts", "ref_ends", "row_axes"], ["reference"]),
        _color("color_lips", _COLOR_LIPS),
        _color("color_mouth", _COLOR_MOUTH),
        _color("color_teeth", _COLOR_TEETH),
        # Layered blend: ref → lips → mouth → teeth; each layer adds mask × (new - old),
        # so zero masks leave the reference bit-exact.
        helper.make_node("Sub", ["color_lips", "reference"], ["lips_delta"]),
        helper.make_node("Mul", ["mask_lips", "lips_delta"], ["lips_term"]),
        helper.make_node("Add", ["reference", "lips_term"], ["with_lips"]),
        helper.make_node("Sub", ["color_mouth", "with_lips"], ["mouth_delta"]),
        helper.make_node("Mul", ["mask_mouth", "mouth_delta"], ["mouth_term"]),
        helper.make_node("Add", ["with_lips", "mouth_term"], ["with_mouth"]),
        helper.make_node("Sub", ["color_teeth", "with_mouth"], ["teeth_delta"]),
        helper.make_node("Mul", ["mask_teeth", "teeth_delta"], ["teeth_term"]),
        helper.make_node("Add", ["with_mouth", "teeth_term"], ["with_teeth"]),
        helper.make_node("Clip", ["with_teeth", "zero", "one"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "demo_lipsync",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.FLOAT, ["batch", 6, INPUT_SIZE, INPUT_SIZE]
            ),
            helper.make_tensor_value_info(
                "audio", TensorProto.FLOAT, ["batch", 2 * AUDIO_WINDOW, 16, 16]
            ),
        ],
        [
            helper.make_tensor_value_info(
                "output", TensorProto.FLOAT, ["batch", 3, INPUT_SIZE, INPUT_SIZE]
            )
        ],
    )
    doc = "Stand-in lip-sync model for lipstream's demo and tests: opens a drawn mouth."
    return _save(_model(graph, doc), path)


def _upper_rows(mouth_center: tuple[float, float]) -> np.ndarray:
    """Signed distance above the mouth centre in px (negative below), ``[1,1,320,1]``."""
    coords = np.arange(INPUT_SIZE, dtype=np.float64) + 0.5
    above = mouth_center[1] * INPUT_SIZE - coords
    return above.reshape(1, 1, INPUT_SIZE, 1).astype(np.float32)
