"""Opening an ONNX model and matching its inputs and outputs to an adapter, by shape.

Inputs are bound by shape, never by name, so exports that call their inputs
``input``/``audio``, ``visual_frames``/``audio_features`` or anything else load alike
(``docs/design/model.md`` §3). Every onnxruntime failure becomes a :class:`ModelLoadError`
naming the file, and so does a requested accelerator that onnxruntime quietly replaced by
the next provider in the list (its libraries missing: TensorRT without libnvinfer, CUDA
without cuDNN), which would otherwise serve a GPU deployment from the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from inference_core.adapter.spec import AdapterSpec
from inference_core.exceptions import ModelLoadError

Dim = int | str | None


@dataclass(frozen=True)
class ModelBinding:
    """Which ONNX input carries which tensor, and whether the batch axis is dynamic."""

    visual_name: str
    audio_name: str
    output_name: str
    dynamic_batch: bool


def fits_shape(dims: Sequence[Dim], expected: Sequence[int]) -> bool:
    """True when ``dims`` (batch first) can hold per-frame tensors of shape ``expected``."""
    if len(dims) != len(expected) + 1:
        return False
    return all(not isinstance(d, int) or d == e for d, e in zip(dims[1:], expected, strict=True))


def shape_text(dims: Sequence[Dim]) -> str:
    return "[" + ",".join("?" if not isinstance(d, int) else str(d) for d in dims) + "]"


def bind_inputs(
    inputs: Sequence[tuple[str, Sequence[Dim]]],
    outputs: Sequence[tuple[str, Sequence[Dim]]],
    spec: AdapterSpec,
) -> ModelBinding:
    """Match a model's declared inputs/outputs to the adapter's tensors by shape.

    Raises :class:`ModelLoadError` describing what was found and what was expected.
    """
    visual = [name for name, dims in inputs if fits_shape(dims, spec.visual_shape)]
    audio = [name for name, dims in inputs if fits_shape(dims, spec.audio_shape)]
    found = ", ".join(f"{name}{shape_text(dims)}" for name, dims in inputs)
    want = (
        f"a visual input [B,{','.join(map(str, spec.visual_shape))}] and an audio input "
        f"[B,{','.join(map(str, spec.audio_shape))}]"
    )
    if len(inputs) != 2 or len(visual) != 1 or len(audio) != 1 or visual[0] == audio[0]:
        raise ModelLoadError(f"model inputs {found} do not fit adapter {spec.name!r}: need {want}")
    fitting_out = [name for name, dims in outputs if fits_shape(dims, spec.output_shape)]
    if not fitting_out:
        out_found = ", ".join(f"{name}{shape_text(dims)}" for name, dims in outputs)
        raise ModelLoadError(
            f"model outputs {out_found} do not fit adapter {spec.name!r}: need an output "
            f"[B,{','.join(map(str, spec.output_shape))}]"
        )
    batch_dims = [dims[0] for name, dims in inputs] + [
        dims[0] for name, dims in outputs if name == fitting_out[0]
    ]
    if any(isinstance(d, int) and d != 1 for d in batch_dims):
        raise ModelLoadError(f"model batch axis must be dynamic or 1, found {found}")
    dynamic = all(not isinstance(d, int) for d in batch_dims)
    return ModelBinding(visual[0], audio[0], fitting_out[0], dynamic)


def open_session(
    source: Path | bytes,
    *,
    label: str | None = None,
    providers: Sequence[str | tuple[str, dict[str, str]]] | None = None,
    options: ort.SessionOptions | None = None,
) -> ort.InferenceSession:
    """Create an onnxruntime session from a file or serialized model bytes.

    Every failure becomes a :class:`ModelLoadError` naming ``label`` (or the file).
    """
    what = label or (str(source) if isinstance(source, Path) else "in-memory model")
    if isinstance(source, Path) and not source.is_file():
        raise ModelLoadError(f"model file {source} does not exist")
    requested = list(providers) if providers else ["CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(
            str(source) if isinstance(source, Path) else source,
            sess_options=options,
            providers=requested,
        )
    except Exception as exc:  # onnxruntime raises bare RuntimeError/Fail/InvalidGraph
        raise ModelLoadError(f"model {what} cannot be loaded: {exc}") from exc
    missing = [p for p in _names(requested) if p not in session.get_providers()]
    if missing:
        raise ModelLoadError(
            f"model {what}: onnxruntime could not start {', '.join(missing)} and fell back to "
            f"{session.get_providers()[0]} ({_missing_hint(missing[0])})"
        )
    return session


def _missing_hint(provider: str) -> str:
    """What to do about ``provider``: install what this onnxruntime does not have, or the
    libraries a provider it has could not load; or the setting that does without it."""
    if provider not in ort.get_available_providers():
        return ABSENT_HINTS.get(provider, f"this onnxruntime has no {provider}")
    return FALLBACK_HINTS.get(provider, "see its log above")


# What a provider this onnxruntime does not have at all takes, and the setting without it.
ABSENT_HINTS = {
    "TensorrtExecutionProvider": "this onnxruntime has no TensorrtExecutionProvider: pip "
    "install onnxruntime-gpu (not onnxruntime) and TensorRT for its CUDA version, or set "
    "devices.tensorrt: false",
    "CUDAExecutionProvider": "this onnxruntime has no CUDAExecutionProvider: pip install "
    "onnxruntime-gpu (not onnxruntime), or set devices.kind: cpu",
}
# What a provider onnxruntime offers but cannot start lacks, and the setting that avoids it.
FALLBACK_HINTS = {
    "TensorrtExecutionProvider": "the TensorRT libraries (libnvinfer) are not loadable: "
    "install TensorRT for onnxruntime-gpu's CUDA version, or set devices.tensorrt: false",
    "CUDAExecutionProvider": "onnxruntime-gpu or the CUDA/cuDNN libraries it needs are "
    "missing: pip install onnxruntime-gpu (not onnxruntime), or set devices.kind: cpu",
}


def _names(providers: Sequence[str | tuple[str, dict[str, str]]]) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers]
