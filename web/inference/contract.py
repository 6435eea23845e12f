"""A model as the standard inference protocols see it: two tensor contracts, two versions.

Every lip-sync model is one model of the Open Inference Protocol (the avatar id is its
name) with two versions, one per tensor contract it serves
(``docs/design/inference-protocols.md`` §17):

``float`` (the default)
    The model's own ONNX interface: its own input and output names, FP32 visual
    ``[-1,6,S,S]`` (already scaled as the model expects), FP32 audio ``[-1,*audio]``
    → FP32 ``[-1,3,S,S]`` in the model's output range, channel-planar.
``uint8``
    The serving graph's, a quarter of the bytes: the same names, UINT8 visual
    ``[-1,S,S,3]`` (the BGR model region, the inner ``S×S`` of the crop), FP32 audio
    → UINT8 ``[-1,S,S,3]`` (BGR faces, ready to paste back).

A request that names no version gets the contract its visual input's datatype names, so
``tritonclient`` users need not know versions exist. A request's declared tensors are
checked here (names, datatypes, shapes, byte sizes) before any of its data is touched;
:func:`frames` then views the bytes as arrays without copying them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from inference_core.serving.core import ModelIo
from web.errors import RequestError
from web.schemas.inference import MAX_REQUEST_FRAMES

Version = Literal["float", "uint8"]
VERSIONS: tuple[Version, ...] = ("float", "uint8")
DEFAULT_VERSION: Version = "float"

#: Every datatype of the protocol, as numpy holds it (little-endian). BYTES has no fixed
#: size and no lip-sync model takes it: it is listed so that its refusal names it.
DATATYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a contract: its name, datatype and shape without the batch axis."""

    name: str
    datatype: str
    frame_shape: tuple[int, ...]

    @property
    def shape(self) -> list[int]:
        """The protocol's shape: ``-1`` for the batch axis, which is free."""
        return [-1, *self.frame_shape]

    @property
    def dtype(self) -> np.dtype[np.generic]:
        return DATATYPES[self.datatype]

    @property
    def frame_bytes(self) -> int:
        return math.prod(self.frame_shape) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{self.name} {self.datatype} [{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class DeclaredTensor:
    """An input as a request declares it, before its data is read."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Contract:
    """One version of one model: its two inputs and its output."""

    model_id: str
    version: Version
    visual: TensorInfo
    audio: TensorInfo
    output: TensorInfo
    max_frames: int = MAX_REQUEST_FRAMES

    @property
    def inputs(self) -> tuple[TensorInfo, TensorInfo]:
        return (self.visual, self.audio)

    @property
    def uint8(self) -> bool:
        return self.version == "uint8"

    @property
    def frame_bytes(self) -> int:
        """Input bytes per frame (visual and audio)."""
        return self.visual.frame_bytes + self.audio.frame_bytes

    def check(self, declared: Sequence[DeclaredTensor]) -> int:
        """The request's batch size ``N``, or :class:`RequestError` 400 naming what is wrong.

        Checks, in order: the input names (each of the contract's, once, nothing else),
        each datatype, each shape (rank, per-frame sizes, a batch of 1..``max_frames``),
        and that both inputs carry the same ``N``. Nothing here reads tensor data.
        """
        expected = {t.name: t for t in self.inputs}
        names = [d.name for d in declared]
        if sorted(names) != sorted(expected):
            raise _bad(
                f"model {self.model_id!r} ({self.version}) takes the inputs "
                f"{self._describe_inputs()}; the request has {names or 'none'}"
            )
        batches = set()
        for tensor in declared:
            want = expected[tensor.name]
            if tensor.datatype != want.datatype:
                other = _other_version_hint(self.version, tensor)
                raise _bad(
                    f"input {tensor.name!r} of model {self.model_id!r} ({self.version}) must "
                    f"be {want.datatype}, got {tensor.datatype}{other}"
                )
            shape = tuple(tensor.shape)
            if len(shape) != len(want.shape) or shape[1:] != want.frame_shape:
                raise _bad(
                    f"input {tensor.name!r} of model {self.model_id!r} ({self.version}) must "
                    f"have shape [{','.join(map(str, want.shape))}], got {list(shape)}"
                )
            if not 1 <= shape[0] <= self.max_frames:
                raise _bad(
                    f"input {tensor.name!r}: the batch axis is {shape[0]}; a request carries "
                    f"1 to {self.max_frames} frames (larger batches: split them)"
                )
            batches.add(shape[0])
        if len(batches) != 1:
            raise _bad(
                f"the inputs' batch sizes differ ({', '.join(map(str, sorted(batches)))}): "
                "one audio window per visual frame"
            )
        return batches.pop()

    def input_bytes(self, name: str, n: int) -> int:
        """Bytes input ``name`` carries for ``n`` frames."""
        tensor = self.visual if name == self.visual.name else self.audio
        return n * tensor.frame_bytes

    def output_shape(self, n: int) -> list[int]:
        return [n, *self.output.frame_shape]

    def _describe_inputs(self) -> str:
        return " and ".join(t.describe() for t in self.inputs)


def contract(
    model_id: str, io: ModelIo, version: Version, *, max_frames: int = MAX_REQUEST_FRAMES
) -> Contract:
    """Version ``version`` of model ``model_id`` with the spec and names in ``io``."""
    spec, binding = io.spec, io.binding
    s = spec.input_size
    audio = TensorInfo(binding.audio_name, "FP32", tuple(spec.audio_shape))
    if version == "uint8":
        visual = TensorInfo(binding.visual_name, "UINT8", (s, s, 3))
        output = TensorInfo(binding.output_name, "UINT8", (s, s, 3))
    else:
        visual = TensorInfo(binding.visual_name, "FP32", spec.visual_shape)
        output = TensorInfo(binding.output_name, "FP32", spec.output_shape)
    return Contract(model_id, version, visual, audio, output, max_frames)


def parse_version(model_id: str, version: str) -> Version | None:
    """A request's version: None for "" (pick by datatype), else one of :data:`VERSIONS`."""
    if version == "":
        return None
    if version in VERSIONS:
        return version
    raise RequestError(
        404,
        "version_not_found",
        f"model {model_id!r} has no version {version[:64]!r}: its versions are "
        f"{', '.join(VERSIONS)} (empty: picked by the visual input's datatype)",
    )


def version_for(
    requested: Version | None, io: ModelIo, declared: Sequence[DeclaredTensor]
) -> Version:
    """The version a request is served by: the one it names, else its visual datatype's."""
    if requested is not None:
        return requested
    visual = next((d for d in declared if d.name == io.binding.visual_name), None)
    return "uint8" if visual is not None and visual.datatype == "UINT8" else DEFAULT_VERSION


def frames(
    contract: Contract, n: int, data: Mapping[str, bytes | bytearray | memoryview]
) -> tuple[np.ndarray, np.ndarray]:
    """The visual and audio arrays viewed on each input's bytes (no copy).

    ``data`` holds each input's bytes by name, already checked against
    :meth:`Contract.input_bytes`; a size that differs is a :class:`RequestError` 400 all
    the same. Non-finite floats (NaN, inf) are refused: the model would turn them into
    garbage faces silently.
    """
    arrays = []
    for tensor in contract.inputs:
        buffer = data[tensor.name]
        size = memoryview(buffer).nbytes
        expected = contract.input_bytes(tensor.name, n)
        if size != expected:
            raise _bad(
                f"input {tensor.name!r} must be {expected} bytes for {n} frame(s) "
                f"({tensor.datatype} [{n},{','.join(map(str, tensor.frame_shape))}]), "
                f"got {size}",
                code="bad_input_size",
            )
        array = np.frombuffer(buffer, tensor.dtype).reshape((n, *tensor.frame_shape))
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise _bad(f"input {tensor.name!r} holds NaN or infinite values", code="bad_values")
        arrays.append(array)
    return arrays[0], arrays[1]


def _other_version_hint(version: Version, tensor: DeclaredTensor) -> str:
    """A hint when the datatype is the other version's."""
    if tensor.datatype == "UINT8" and version == "float":
        return " (UINT8 regions are version uint8)"
    if tensor.datatype == "FP32" and version == "uint8":
        return " (FP32 model inputs are version float)"
    if tensor.datatype not in DATATYPES and tensor.datatype != "BYTES":
        return f"; datatypes are {', '.join(DATATYPES)}"
    return ""


def _bad(message: str, *, code: str = "bad_input") -> RequestError:
    return RequestError(400, code, message)
