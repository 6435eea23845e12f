"""Full check of an avatar package, reporting every problem at once.

Used by ``lipstream avatar validate DIR`` and before a package is registered. Beyond what
:meth:`AvatarPackage.load` checks, it reads every frame's header, parses both ONNX
graphs (without their weights) to match their inputs and outputs to the adapter, and
refuses ONNX external-data references that leave the package (CVE-2022-25882,
CVE-2024-27318).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from PIL import Image, UnidentifiedImageError

from inference_core.adapter.onnx_io import Dim, bind_inputs, fits_shape
from inference_core.adapter.spec import AdapterSpec
from inference_core.avatars.exceptions import AvatarInvalidError
from inference_core.avatars.package import AvatarPackage, is_inside
from inference_core.exceptions import ModelLoadError

logger = logging.getLogger(__name__)

ENCODER_INPUT = (1, 80, 16)
ENCODER_OUTPUT = (512,)

TensorDecl = tuple[str, list[Dim]]


def _dims(value_info: onnx.ValueInfoProto) -> list[Dim]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def read_onnx_io(path: Path, package_dir: Path) -> tuple[list[TensorDecl], list[TensorDecl]]:
    """Return the graph's real inputs and its outputs, after checking external data.

    Raises :class:`ModelLoadError` for an unreadable graph or external data that would be
    read from outside ``package_dir``.
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, OSError, ...
        raise ModelLoadError(f"{path.name} is not a readable ONNX model: {exc}") from exc
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = path.parent / location
        if not location or Path(location).is_absolute() or not is_inside(target, package_dir):
            raise ModelLoadError(
                f"{path.name}: tensor {tensor.name!r} keeps its data at {location!r}, "
                "outside the avatar package; external data must stay inside the package"
            )
        if not target.is_file():
            raise ModelLoadError(f"{path.name}: external data file {location!r} is missing")
    initializers = {t.name for t in model.graph.initializer}
    inputs = [(i.name, _dims(i)) for i in model.graph.input if i.name not in initializers]
    outputs = [(o.name, _dims(o)) for o in model.graph.output]
    return inputs, outputs


def check_lipsync_model(path: Path, package_dir: Path, spec: AdapterSpec) -> list[str]:
    """Problems with the lip-sync ONNX (empty list when it fits the adapter)."""
    try:
        inputs, outputs = read_onnx_io(path, package_dir)
        bind_inputs(inputs, outputs, spec)
    except ModelLoadError as exc:
        return [f"models.lipsync: {exc}"]
    return []


def check_audio_encoder(path: Path, package_dir: Path) -> list[str]:
    """Problems with the audio-encoder ONNX ([B,1,80,16] mel -> [B,512])."""
    try:
        inputs, outputs = read_onnx_io(path, package_dir)
    except ModelLoadError as exc:
        return [f"models.audio_encoder: {exc}"]
    problems = []
    if len(inputs) != 1 or not fits_shape(inputs[0][1], ENCODER_INPUT):
        found = ", ".join(f"{n}{d}" for n, d in inputs)
        problems.append(f"models.audio_encoder: inputs {found} do not fit: need one [B,1,80,16]")
    if not outputs or not fits_shape(outputs[0][1], ENCODER_OUTPUT):
        found = ", ".join(f"{n}{d}" for n, d in outputs)
        problems.append(f"models.audio_encoder: outputs {found} do not fit: need [B,512]")
    return problems


def check_frames(package: AvatarPackage) -> list[str]:
    """Every frame readable (header) and of the manifest's frame size."""
    expected = tuple(package.manifest.frame_size)
    unreadable: list[str] = []
    wrong: list[str] = []
    for path in package.frame_paths:
        try:
            with Image.open(path) as image:
                if image.size != expected:
                    wrong.append(f"{path.name} is {image.size[0]}x{image.size[1]}")
        except (OSError, UnidentifiedImageError):
            unreadable.append(path.name)
    problems = []
    if unreadable:
        shown = ", ".join(unreadable[:5])
        problems.append(f"frames: {len(unreadable)} unreadable image(s): {shown}")
    if wrong:
        w, h = expected
        problems.append(
            f"frames: {len(wrong)} frame(s) not {w}x{h} as frame_size says: {', '.join(wrong[:3])}"
        )
    return problems


def validate_package(directory: Path) -> list[str]:
    """Every problem with the package at ``directory``; an empty list means it is usable."""
    try:
        package = AvatarPackage.load(directory)
    except AvatarInvalidError as exc:
        return exc.problems
    problems = check_frames(package)
    spec = package.manifest.adapter
    problems += check_lipsync_model(package.lipsync_path, directory, spec)
    if package.encoder_path is not None and spec.audio_feature == "ave":
        problems += check_audio_encoder(package.encoder_path, directory)
    return problems
